// A Jinja2 interpreter for Hugging Face chat templates.
//
// Models ship their prompt format as a Jinja2 `chat_template`; transformers renders it with
// jinja2's ImmutableSandboxedEnvironment (trim_blocks and lstrip_blocks on, the loopcontrols
// extension, its own tojson filter and the raise_exception / strftime_now globals). This renders
// the same templates to the same bytes, for the subset of Jinja2 chat templates use: text and
// {{ }} / {% %} / {# #} with whitespace control, if / for (loop variables, else, filtered
// iterables, break / continue) / set (namespaces, block set) / macro, Python-like expressions
// (arithmetic, comparisons, `in`, `~`, slices, conditional expressions), the common filters,
// tests, str / dict methods and globals (range, dict, namespace, raise_exception, strftime_now).
//
// Anything outside the subset is refused loudly: an unknown tag, filter or test when the
// template is parsed, with its line and column; an unsupported method or operation when it runs.
// Rendering never substitutes a guess.
#pragma once

#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace exl3::jinja {

struct Program;  // the parsed template (src/text/jinja/ast.hpp)

struct RenderOptions {
  // The time strftime_now() formats (local time); unset: the current time.
  std::optional<std::time_t> now;
};

class Template {
 public:
  // Parses `source`. `name` starts every error message (e.g. the file the template came from).
  // Throws exl3::Error "name:line:col: problem" for syntax errors and unknown filters or tests.
  Template(std::string_view source, std::string name);
  ~Template();
  Template(const Template&);
  Template& operator=(const Template&);
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context` (an object; key order is kept, as tojson shows it).
  // Throws exl3::Error naming the template and the line of the failing construct; a template's
  // own raise_exception(msg) reads "name: the template raised: msg".
  std::string render(const nlohmann::ordered_json& context, const RenderOptions& opts = {}) const;

  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<const Program> program_;
};

}  // namespace exl3::jinja
