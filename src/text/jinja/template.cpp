// exl3::jinja::Template: parse once, render many times (see exl3/text/jinja.hpp).
#include "exl3/text/jinja.hpp"

#include "ast.hpp"
#include "builtins.hpp"
#include "eval.hpp"
#include "exl3/error.hpp"
#include "lexer.hpp"

namespace exl3::jinja {

namespace {

// Every failure leaves as exl3::Error: the evaluator converts what it expects, and this net
// catches what a missed check would let through (a standard-library exception, a value error
// outside any expression), so a caller never sees another type.
template <typename F>
auto guarded(const std::string& name, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const ValueError& e) {
    fail("{}: {}", name, e.message);
  } catch (const TemplateRaised& e) {
    fail("{}: the template raised an error: {}", name, e.message);
  } catch (const std::exception& e) {
    fail("{}: the template interpreter failed: {}", name, e.what());
  }
}

}  // namespace

Template::Template(std::string_view source, std::string name) : name_(std::move(name)) {
  auto p = std::make_shared<Program>();
  p->source = normalize_source(source);
  p->body = guarded(name_, [&] { return parse(p->source, name_); });
  program_ = std::move(p);
}

Template::~Template() = default;
Template::Template(const Template&) = default;
Template& Template::operator=(const Template&) = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context,
                             const RenderOptions& opts) const {
  return guarded(name_, [&] { return evaluate(*program_, name_, context, opts.now); });
}

}  // namespace exl3::jinja
