// The Jinja2 interpreter on its own: whitespace rules, scoping, values, and above all the errors
// (line and column for syntax, the failing construct's line at run time). Behaviour shared with
// transformers byte for byte is pinned by jinja_features_test.cpp's goldens; these are the
// cases a golden cannot express.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "exl3/error.hpp"
#include "exl3/text/jinja.hpp"
#include "test_support.hpp"

using exl3::jinja::RenderOptions;
using exl3::jinja::Template;
using json = nlohmann::ordered_json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {

std::string render(std::string_view src, const json& ctx = json::object(),
                   const RenderOptions& o = {}) {
  return Template(src, "t.jinja").render(ctx, o);
}

using exl3::test::error_of;

std::string parse_error(std::string_view src) {
  return error_of([&] { Template(src, "t.jinja"); });
}

std::string render_error(std::string_view src, const json& ctx = json::object()) {
  return error_of([&] { render(src, ctx); });
}

}  // namespace

TEST(Jinja, TextAndExpressions) {
  EXPECT_EQ(render("plain text"), "plain text");
  EXPECT_EQ(render(""), "");
  EXPECT_EQ(
      render("{{ a }}-{{ b.c }}-{{ d[1] }}", {{"a", "x"}, {"b", {{"c", 2}}}, {"d", {1, 2.5}}}),
      "x-2-2.5");
  // One trailing newline of the template goes (keep_trailing_newline is off), not two.
  EXPECT_EQ(render("a\n"), "a");
  EXPECT_EQ(render("a\n\n"), "a\n");
  EXPECT_EQ(render("a\r\nb"), "a\nb");
}

TEST(Jinja, WhitespaceControl) {
  // trim_blocks eats the newline after a block tag, lstrip_blocks the indentation before it.
  EXPECT_EQ(render("{% if true %}\n  x\n  {% endif %}\ny"), "  x\ny");
  // Expression tags are not trimmed.
  EXPECT_EQ(render("  {{ 'a' }}\nb"), "  a\nb");
  EXPECT_EQ(render("a  {{- 'b' -}}  \n c"), "abc");
  // `+` keeps what lstrip / trim would remove.
  EXPECT_EQ(render("  {%+ if true %}x{% endif +%}\ny"), "  x\ny");
  EXPECT_EQ(render("a\n{# note #}\nb"), "a\nb");
}

TEST(Jinja, Scoping) {
  // A set inside a loop body lives for that iteration; namespaces carry values out.
  EXPECT_EQ(
      render("{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"),
      "231");
  EXPECT_EQ(render("{% set ns = namespace(t=0) %}{% for i in range(4) %}{% set ns.t = ns.t + i %}"
                   "{% endfor %}{{ ns.t }}"),
            "6");
  // An if block is not a scope.
  EXPECT_EQ(render("{% if true %}{% set y = 'in' %}{% endif %}{{ y }}"), "in");
  // Macros see top-level names but not their caller's loop variables.
  EXPECT_EQ(render("{% set g = 'G' %}{% macro m() %}{{ g }}{{ i }}{% endmacro %}"
                   "{% for i in [1] %}{{ m() }}{% endfor %}"),
            "G");
}

TEST(Jinja, KeyOrderComesFromTheContext) {
  const json ctx = json::parse(R"({"d": {"zeta": 1, "alpha": [true, null], "mid": "é"}})");
  EXPECT_EQ(render("{{ d | tojson }}", ctx), R"({"zeta": 1, "alpha": [true, null], "mid": "é"})");
  EXPECT_EQ(render("{% for k in d %}{{ k }} {% endfor %}", ctx), "zeta alpha mid ");
}

TEST(Jinja, UndefinedIsQuietUntilUsed) {
  EXPECT_EQ(
      render("[{{ nope }}][{{ m.nope }}][{{ nope | length }}][{% for x in nope %}x{% endfor %}]",
             {{"m", json::object()}}),
      "[][][0][]");
  EXPECT_EQ(render("{{ nope is defined }} {{ nope | default('d') }} {{ nope ~ 'x' }}"),
            "False d x");
}

TEST(Jinja, StrftimeNowUsesTheGivenTime) {
  RenderOptions o;
  o.now = 1'000'000'000;  // 2001-09-09 01:46:40 UTC: September 2001 in every time zone
  EXPECT_EQ(render("{{ strftime_now('%Y-%m') }}", json::object(), o), "2001-09");
  EXPECT_EQ(render("{{ strftime_now('%Y') | length }}"), "4");  // the current time
}

TEST(Jinja, SyntaxErrorsNameLineAndColumn) {
  EXPECT_THAT(parse_error("ok\n{% frobnicate %}"),
              HasSubstr("t.jinja:2:4: unknown or unsupported tag 'frobnicate'"));
  EXPECT_THAT(parse_error("{{ x | nosuchfilter }}"),
              HasSubstr("t.jinja:1:8: unknown filter 'nosuchfilter'"));
  EXPECT_THAT(parse_error("{% if x is wobbly %}{% endif %}"),
              HasSubstr("t.jinja:1:12: unknown test 'wobbly'"));
  EXPECT_THAT(parse_error("a\n  {% if x %}\nb"), HasSubstr("t.jinja:2:6: 'if' is never closed"));
  EXPECT_THAT(parse_error("{% endfor %}"), HasSubstr("t.jinja:1:4: unexpected 'endfor'"));
  EXPECT_THAT(parse_error("{{ 'abc }}"), HasSubstr("t.jinja:1:4: unterminated string literal"));
  EXPECT_THAT(parse_error("{{ x "), HasSubstr("t.jinja:1:3: missing '}}'"));
  EXPECT_THAT(parse_error("{# open"), HasSubstr("t.jinja:1:1: missing end of comment tag"));
  EXPECT_THAT(parse_error("{{ a ? b }}"), HasSubstr("t.jinja:1:6: unexpected character '?'"));
  EXPECT_THAT(parse_error("{{ a < b < c }}"), HasSubstr("chained comparisons"));
  EXPECT_THAT(parse_error("{% for x in y recursive %}{% endfor %}"),
              HasSubstr("recursive loops are not supported"));
  EXPECT_THAT(parse_error("{% raw %}x{% endraw %}"), HasSubstr("raw blocks are not supported"));
  EXPECT_THAT(parse_error("{{ f(a=1, 2) }}"), HasSubstr("positional argument follows a keyword"));
  EXPECT_THAT(parse_error("{% set x %}"), HasSubstr("'set' is never closed"));
  EXPECT_THAT(parse_error("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}"),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(parse_error("{{ " + std::string(5000, '-') + "1 }}"), HasSubstr("nested too deeply"));
  EXPECT_EQ(render("{{ " + std::string(50, '(') + "1" + std::string(50, ')') + " }}"), "1");
}

TEST(Jinja, RuntimeErrorsNameTheConstruct) {
  EXPECT_THAT(render_error("line one\n{{ missing + 1 }}"),
              HasSubstr("t.jinja:2:12: 'missing' is undefined"));
  EXPECT_THAT(render_error("{{ m.a.b }}", {{"m", json::object()}}),
              HasSubstr("'dict object' has no attribute 'a'"));
  EXPECT_THAT(render_error("{{ nofunc(1) }}"), HasSubstr("'nofunc' is undefined"));
  EXPECT_THAT(render_error("{{ 'a' + 1 }}"),
              HasSubstr("unsupported operand type(s) for +: 'str' and 'int'"));
  EXPECT_THAT(render_error("{{ 1 // 0 }}"), HasSubstr("division or modulo by zero"));
  EXPECT_THAT(render_error("{{ 'a' < 1 }}"), HasSubstr("'<' is not supported"));
  EXPECT_THAT(render_error("{% set d = {} %}{% set d.x = 1 %}"),
              HasSubstr("only namespace() objects take attributes"));
  EXPECT_THAT(
      render_error("{% set l = [] %}{{ l.append(1) }}"),
      HasSubstr(
          "the list method append() would modify a value; templates may only read their values"));
  EXPECT_THAT(render_error("{{ nope | tojson }}"), HasSubstr("not JSON serializable"));
  EXPECT_THAT(render_error("{% for x in 3 %}{% endfor %}"),
              HasSubstr("'int' object is not iterable"));
  EXPECT_THAT(render_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"),
              HasSubstr("takes 1 arguments (2 given)"));
  EXPECT_THAT(render_error("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"),
              HasSubstr("nested too deeply"));
  EXPECT_THAT(render_error("{{ 'x'.zfill(3) }}"),
              HasSubstr("'str object' has no attribute 'zfill'"));
  EXPECT_THAT(render_error("{{ '{:>4}'.format(1) }}"),
              HasSubstr("conversions and layout options are not supported"));
  EXPECT_THAT(render_error("{{ 'a' | trim(1, 2) }}"),
              HasSubstr("trim() takes at most 1 arguments"));
  EXPECT_THAT(render_error("{{ [1] | join(sep=',') }}"),
              HasSubstr("unexpected keyword argument 'sep'"));
  EXPECT_THAT(render_error("{% break %}"), HasSubstr("break or continue outside a loop"));
  EXPECT_THAT(render_error("{{ 'a b'.split(none, 'x') }}"),
              HasSubstr("an integer is required, got str"));
  EXPECT_THAT(render_error("{{ [1, 'a'] | sum }}"), HasSubstr("sum needs numbers"));
  EXPECT_THAT(render_error("{{ '{99999999999999999999}'.format(1) }}"), HasSubstr("out of range"));
  EXPECT_THAT(parse_error("{{ x.99999999999999999999 }}"), HasSubstr("out of range"));
  EXPECT_THAT(render_error("{{ 9223372036854775807 + 1 }}"), HasSubstr("integer overflow"));
  EXPECT_THAT(render_error("{{ 3 ** 99 }}"), HasSubstr("integer overflow"));
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ -2 ** 2 }} {{ 1 ** 1000000000 }} {{ (-1) ** 1000000001 }}"),
            "4611686018427387904 4 1 -1");
}

TEST(Jinja, RaiseExceptionIsTheTemplatesOwnMessage) {
  const auto e = render_error(
      "{% if messages | length > 1 %}\n{{ raise_exception('roles must alternate') }}{% endif %}",
      {{"messages", {1, 2}}});
  EXPECT_THAT(e, StartsWith("t.jinja:2:"));
  EXPECT_THAT(e, HasSubstr("the template raised an error: roles must alternate"));
}

TEST(Jinja, TemplatesAreValuesAndRenderRepeatedly) {
  Template t("{{ n * 2 }}", "t");
  const Template copy = t;
  EXPECT_EQ(t.render({{"n", 2}}), "4");
  EXPECT_EQ(copy.render({{"n", 21}}), "42");
  EXPECT_EQ(t.name(), "t");
  EXPECT_THAT(error_of([&] { t.render(json::array()); }), HasSubstr("context must be an object"));
  json deep = 1;
  for (int i = 0; i < 300; ++i) deep = json::array({deep});
  EXPECT_THAT(error_of([&] {
                t.render({{"n", 1}, {"deep", deep}});
              }),
              HasSubstr("nested more than 256 levels"));
}
