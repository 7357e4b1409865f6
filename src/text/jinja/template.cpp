// exl3::jinja::Template: parse once, render many times (see exl3/text/jinja.hpp).
#include "exl3/text/jinja.hpp"

#include "ast.hpp"
#include "eval.hpp"
#include "lexer.hpp"

namespace exl3::jinja {

Template::Template(std::string_view source, std::string name) : name_(std::move(name)) {
  auto p = std::make_shared<Program>();
  p->source = normalize_source(source);
  p->body = parse(p->source, name_);
  program_ = std::move(p);
}

Template::~Template() = default;
Template::Template(const Template&) = default;
Template& Template::operator=(const Template&) = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context,
                             const RenderOptions& opts) const {
  return evaluate(*program_, name_, context, opts.now);
}

}  // namespace exl3::jinja
