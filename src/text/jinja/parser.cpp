// Recursive-descent parser from tokens to the AST, with Jinja2's precedence:
// condition > or > and > not > comparison > + - > ~ > * / // % > ** > unary > postfix / filter.
#include <algorithm>
#include <initializer_list>

#include "ast.hpp"
#include "builtins.hpp"
#include "exl3/error.hpp"
#include "lexer.hpp"

namespace exl3::jinja {

namespace {

class Parser {
 public:
  Parser(const std::string& src, const std::string& name)
      : src_(src), name_(name), toks_(lex(src, name)) {}

  Body run() {
    std::string ended;
    Body b = body({}, &ended);
    return b;
  }

 private:
  const std::string& src_;
  const std::string& name_;
  std::vector<Token> toks_;
  size_t i_ = 0;

  [[noreturn]] void error(size_t at, std::string_view msg) const {
    fail("{}: {}", where(src_, name_, at), msg);
  }
  const Token& peek(size_t k = 0) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  const Token& next() { return toks_[std::min(i_++, toks_.size() - 1)]; }
  bool at_op(std::string_view op, size_t k = 0) const {
    return peek(k).kind == Tok::kOp && peek(k).text == op;
  }
  bool at_name(std::string_view n, size_t k = 0) const {
    return peek(k).kind == Tok::kName && peek(k).text == n;
  }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!at_name(n)) return false;
    ++i_;
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kText:
        return "text";
      case Tok::kString:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op))
      error(peek().offset, fmt::format("expected '{}', got {}", op, describe(peek())));
  }
  void expect(Tok kind, std::string_view what) {
    if (peek().kind != kind)
      error(peek().offset, fmt::format("expected {}, got {}", what, describe(peek())));
    ++i_;
  }
  std::string expect_name(std::string_view what) {
    if (peek().kind != Tok::kName)
      error(peek().offset, fmt::format("expected {}, got {}", what, describe(peek())));
    return next().text;
  }
  void end_tag() { expect(Tok::kBlockEnd, "'%}'"); }

  static ExprPtr node(Expr::Kind k, size_t off, std::string name = {}) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->offset = off;
    e->name = std::move(name);
    return e;
  }
  static ExprPtr binary(Expr::Kind k, size_t off, std::string op, ExprPtr a, ExprPtr b) {
    auto e = node(k, off, std::move(op));
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  // ---- statements ----

  // Statements up to a block tag named in `ends` (its name consumed, stored in *ended) or the end
  // of the template (only when `ends` is empty).
  Body body(std::initializer_list<std::string_view> ends, std::string* ended, size_t open = 0,
            std::string_view opener = {}) {
    Body out;
    while (true) {
      const Token& t = peek();
      if (t.kind == Tok::kEof) {
        if (ends.size() == 0) return out;
        error(open, fmt::format("'{}' is never closed (expected '{{% {} %}}')", opener,
                                *(ends.end() - 1)));
      }
      if (t.kind == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->offset = t.offset;
        s->text = t.text;
        out.push_back(std::move(s));
        ++i_;
      } else if (t.kind == Tok::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->offset = t.offset;
        s->expr = expression();
        expect(Tok::kVarEnd, "'}}'");
        out.push_back(std::move(s));
      } else if (t.kind == Tok::kBlockBegin) {
        const Token& tag = peek(1);
        if (tag.kind == Tok::kName && std::find(ends.begin(), ends.end(), tag.text) != ends.end()) {
          i_ += 2;
          *ended = tag.text;
          return out;
        }
        ++i_;
        out.push_back(statement());
      } else {
        error(t.offset, fmt::format("unexpected {}", describe(t)));
      }
    }
  }

  StmtPtr statement() {
    const Token tag = peek();
    const Nest nest(*this, tag.offset);
    if (tag.kind != Tok::kName)
      error(tag.offset, fmt::format("expected a tag name, got {}", describe(tag)));
    ++i_;
    auto s = std::make_unique<Stmt>();
    s->offset = tag.offset;
    const std::string& n = tag.text;
    std::string ended;
    if (n == "if") {
      s->kind = Stmt::Kind::kIf;
      s->conds.push_back(expression());
      end_tag();
      while (true) {
        s->bodies.push_back(body({"elif", "else", "endif"}, &ended, tag.offset, "if"));
        if (ended == "elif") {
          s->conds.push_back(expression());
          end_tag();
        } else if (ended == "else") {
          end_tag();
          s->bodies.push_back(body({"endif"}, &ended, tag.offset, "if"));
          end_tag();
          break;
        } else {
          end_tag();
          break;
        }
      }
    } else if (n == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets = names("a loop variable");
      if (!skip_name("in"))
        error(peek().offset, fmt::format("expected 'in', got {}", describe(peek())));
      s->expr = expression(false);
      if (skip_name("if")) s->cond = expression(false);
      if (at_name("recursive")) error(peek().offset, "recursive loops are not supported");
      end_tag();
      s->bodies.push_back(body({"else", "endfor"}, &ended, tag.offset, "for"));
      end_tag();
      if (ended == "else") {
        s->bodies.push_back(body({"endfor"}, &ended, tag.offset, "for"));
        end_tag();
      }
    } else if (n == "set") {
      s->kind = Stmt::Kind::kSet;
      if (peek().kind == Tok::kName && at_op(".", 1)) {
        s->targets.push_back(next().text);
        ++i_;
        s->text = expect_name("an attribute name");
      } else {
        s->targets = names("a variable name");
      }
      if (skip_op("=")) {
        s->expr = expression();
        end_tag();
      } else if (peek().kind == Tok::kBlockEnd && s->text.empty() && s->targets.size() == 1) {
        end_tag();
        s->bodies.push_back(body({"endset"}, &ended, tag.offset, "set"));
        end_tag();
      } else {
        error(peek().offset, fmt::format("expected '=' or '%}}', got {}", describe(peek())));
      }
    } else if (n == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->text = expect_name("a macro name");
      expect_op("(");
      while (!skip_op(")")) {
        if (!s->params.empty()) expect_op(",");
        if (skip_op(")")) break;
        std::string p = expect_name("a parameter name");
        ExprPtr def;
        if (skip_op("=")) def = expression();
        s->params.emplace_back(std::move(p), std::move(def));
      }
      end_tag();
      s->bodies.push_back(body({"endmacro"}, &ended, tag.offset, "macro"));
      if (peek().kind == Tok::kName) ++i_;  // {% endmacro name %}
      end_tag();
    } else if (n == "break" || n == "continue") {
      s->kind = n == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      end_tag();
    } else if (n == "generation") {
      s->kind = Stmt::Kind::kGeneration;
      end_tag();
      s->bodies.push_back(body({"endgeneration"}, &ended, tag.offset, "generation"));
      end_tag();
    } else if (n.starts_with("end") || n == "elif" || n == "else") {
      error(tag.offset, fmt::format("unexpected '{}' (no open block it could close)", n));
    } else {
      error(tag.offset, fmt::format("unknown or unsupported tag '{}'", n));
    }
    return s;
  }

  std::vector<std::string> names(std::string_view what) {
    std::vector<std::string> out;
    const bool paren = skip_op("(");
    do {
      out.push_back(expect_name(what));
    } while (skip_op(","));
    if (paren) expect_op(")");
    return out;
  }

  // ---- expressions ----

  // Nesting deeper than this is refused rather than risking the stack on a hostile template.
  static constexpr int kMaxDepth = 200;
  int depth_ = 0;
  struct Nest {
    Parser& p;
    Nest(Parser& parser, size_t at) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.error(at, "nested too deeply");
    }
    ~Nest() { --p.depth_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;
  };

  ExprPtr expression(bool with_condition = true) {
    const size_t off = peek().offset;
    const Nest nest(*this, off);
    ExprPtr e = or_expr();
    while (with_condition && skip_name("if")) {
      auto c = node(Expr::Kind::kCondition, off);
      c->args.push_back(std::move(e));
      c->args.push_back(or_expr());
      c->args.push_back(skip_name("else") ? expression() : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (at_name("or")) {
      const size_t off = next().offset;
      e = binary(Expr::Kind::kOr, off, "or", std::move(e), and_expr());
    }
    return e;
  }

  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (at_name("and")) {
      const size_t off = next().offset;
      e = binary(Expr::Kind::kAnd, off, "and", std::move(e), not_expr());
    }
    return e;
  }

  ExprPtr not_expr() {
    if (at_name("not")) {
      const Nest nest(*this, peek().offset);
      auto e = node(Expr::Kind::kUnary, next().offset, "not");
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }

  ExprPtr compare() {
    ExprPtr e = sum();
    bool compared = false;
    while (true) {
      std::string op;
      const size_t off = peek().offset;
      if (peek().kind == Tok::kOp &&
          (at_op("==") || at_op("!=") || at_op("<") || at_op(">") || at_op("<=") || at_op(">="))) {
        op = next().text;
      } else if (at_name("in")) {
        ++i_;
        op = "in";
      } else if (at_name("not") && at_name("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        return e;
      }
      if (compared) error(off, "chained comparisons (a < b < c) are not supported");
      compared = true;
      e = binary(Expr::Kind::kBinary, off, op, std::move(e), sum());
    }
  }

  ExprPtr sum() {
    ExprPtr e = concat();
    while (at_op("+") || at_op("-")) {
      const Token& t = next();
      e = binary(Expr::Kind::kBinary, t.offset, t.text, std::move(e), concat());
    }
    return e;
  }

  ExprPtr concat() {
    ExprPtr e = product();
    while (at_op("~")) {
      const size_t off = next().offset;
      e = binary(Expr::Kind::kBinary, off, "~", std::move(e), product());
    }
    return e;
  }

  ExprPtr product() {
    ExprPtr e = power();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& t = next();
      e = binary(Expr::Kind::kBinary, t.offset, t.text, std::move(e), power());
    }
    return e;
  }

  ExprPtr power() {
    ExprPtr e = unary(true);
    while (at_op("**")) {
      const size_t off = next().offset;
      e = binary(Expr::Kind::kBinary, off, "**", std::move(e), unary(true));
    }
    return e;
  }

  ExprPtr unary(bool with_filter) {
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const Token& t = next();
      const Nest nest(*this, t.offset);
      e = node(Expr::Kind::kUnary, t.offset, t.text);
      e->args.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (at_op(".")) {
        const size_t off = next().offset;
        if (peek().kind == Tok::kInt) {
          auto ix = node(Expr::Kind::kIndex, off);
          ExprPtr lit = primary();  // the integer literal
          ix->args.push_back(std::move(e));
          ix->args.push_back(std::move(lit));
          e = std::move(ix);
          continue;
        }
        auto a = node(Expr::Kind::kAttr, off, expect_name("an attribute name"));
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (at_op("[")) {
        e = subscript(std::move(e));
      } else if (at_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr subscript(ExprPtr obj) {
    const size_t off = next().offset;  // [
    ExprPtr parts[3];
    int colons = 0;
    while (!at_op("]")) {
      if (skip_op(":")) {
        if (++colons > 2) error(peek().offset, "a slice takes at most two ':'");
        continue;
      }
      if (parts[colons])
        error(peek().offset, fmt::format("expected ']', got {}", describe(peek())));
      parts[colons] = expression();
    }
    ++i_;
    if (colons == 0) {
      if (!parts[0]) error(off, "empty subscript");
      return binary(Expr::Kind::kIndex, off, "", std::move(obj), std::move(parts[0]));
    }
    auto s = node(Expr::Kind::kSlice, off);
    s->args.push_back(std::move(obj));
    for (auto& p : parts) s->args.push_back(std::move(p));
    return s;
  }

  void call_args(Expr& e) {
    expect_op("(");
    size_t n = 0;
    while (!skip_op(")")) {
      if (n++ > 0) {
        expect_op(",");
        if (skip_op(")")) break;
      }
      if (at_op("*") || at_op("**"))
        error(peek().offset, "*args / **kwargs in calls are not supported");
      if (peek().kind == Tok::kName && at_op("=", 1)) {
        std::string k = next().text;
        ++i_;
        e.kwargs.emplace_back(std::move(k), expression());
      } else {
        if (!e.kwargs.empty())
          error(peek().offset, "a positional argument follows a keyword argument");
        e.args.push_back(expression());
      }
    }
  }

  ExprPtr call(ExprPtr callee) {
    auto c = node(Expr::Kind::kCall, peek().offset);
    c->args.push_back(std::move(callee));
    call_args(*c);
    return c;
  }

  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (at_op("|")) {
        ++i_;
        const Token& t = peek();
        const std::string name = expect_name("a filter name");
        if (!is_filter(name)) error(t.offset, fmt::format("unknown filter '{}'", name));
        auto f = node(Expr::Kind::kFilter, t.offset, name);
        f->args.push_back(std::move(e));
        if (at_op("(")) call_args(*f);
        e = std::move(f);
      } else if (at_name("is")) {
        ++i_;
        auto t = node(Expr::Kind::kTest, peek().offset);
        t->negated = skip_name("not");
        const Token& nt = peek();
        t->name = expect_name("a test name");
        if (!is_test(t->name)) error(nt.offset, fmt::format("unknown test '{}'", t->name));
        t->args.push_back(std::move(e));
        if (at_op("(")) {
          call_args(*t);
        } else if ((peek().kind == Tok::kName || peek().kind == Tok::kString ||
                    peek().kind == Tok::kInt || peek().kind == Tok::kFloat || at_op("[") ||
                    at_op("{")) &&
                   !at_name("else") && !at_name("or") && !at_name("and") && !at_name("is") &&
                   !at_name("if") && !at_name("in") && !at_name("not")) {
          t->args.push_back(postfix(primary()));
        }
        e = std::move(t);
      } else if (at_op("(")) {
        e = call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr primary() {
    const Token& t = peek();
    switch (t.kind) {
      case Tok::kName: {
        ++i_;
        auto lit = node(Expr::Kind::kLiteral, t.offset);
        if (t.text == "true" || t.text == "True") {
          lit->value = true;
        } else if (t.text == "false" || t.text == "False") {
          lit->value = false;
        } else if (t.text == "none" || t.text == "None") {
          lit->value = nullptr;
        } else {
          return node(Expr::Kind::kName, t.offset, t.text);
        }
        return lit;
      }
      case Tok::kString: {
        auto lit = node(Expr::Kind::kLiteral, t.offset);
        std::string s;
        while (peek().kind == Tok::kString) s += next().text;  // adjacent literals join
        lit->value = std::move(s);
        return lit;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        ++i_;
        auto lit = node(Expr::Kind::kLiteral, t.offset);
        try {
          if (t.kind == Tok::kInt) {
            lit->value = static_cast<int64_t>(std::stoll(t.text));
          } else {
            lit->value = std::stod(t.text);
          }
        } catch (const std::exception&) {
          error(t.offset, fmt::format("number '{}' is out of range", t.text));
        }
        return lit;
      }
      default:
        break;
    }
    if (at_op("(")) {
      const size_t off = next().offset;
      if (skip_op(")")) return node(Expr::Kind::kList, off, "tuple");  // ()
      ExprPtr e = expression();
      if (!at_op(",")) {
        expect_op(")");
        return e;
      }
      auto tuple = node(Expr::Kind::kList, off, "tuple");
      tuple->args.push_back(std::move(e));
      while (skip_op(",")) {
        if (at_op(")")) break;
        tuple->args.push_back(expression());
      }
      expect_op(")");
      return tuple;
    }
    if (at_op("[")) {
      auto list = node(Expr::Kind::kList, next().offset);
      while (!skip_op("]")) {
        if (!list->args.empty()) {
          expect_op(",");
          if (skip_op("]")) break;
        }
        list->args.push_back(expression());
      }
      return list;
    }
    if (at_op("{")) {
      auto dict = node(Expr::Kind::kDict, next().offset);
      while (!skip_op("}")) {
        if (!dict->args.empty()) {
          expect_op(",");
          if (skip_op("}")) break;
        }
        dict->args.push_back(expression());
        expect_op(":");
        dict->args.push_back(expression());
      }
      return dict;
    }
    error(t.offset, fmt::format("expected an expression, got {}", describe(t)));
  }
};

}  // namespace

Body parse(const std::string& source, const std::string& name) {
  return Parser(source, name).run();
}

}  // namespace exl3::jinja
