// The tree-walking evaluator: Jinja2's scoping (each loop iteration and each macro call gets its
// own scope; `if` does not), Python's operators, and errors that name the line and column.
#include "eval.hpp"

#include <cmath>
#include <unordered_map>

#include <fmt/format.h>

#include "builtins.hpp"
#include "exl3/error.hpp"
#include "lexer.hpp"
#include "unicode.hpp"

namespace exl3::jinja {

namespace {

using Frame = std::unordered_map<std::string, Value>;

constexpr int kMaxCallDepth = 256;

class Evaluator {
 public:
  Evaluator(const Program& p, const std::string& name, std::optional<std::time_t> now)
      : prog_(p), name_(name), now_(now) {}

  std::string run(const nlohmann::ordered_json& context) {
    if (!context.is_object()) fail("{}: the render context must be an object", name_);
    Frame top;
    try {
      for (const auto& [k, v] : context.items()) top[k] = from_json(v);
    } catch (const ValueError& e) {
      fail("{}: {}", name_, e.message);
    }
    scopes_ = {&top};
    std::string out;
    out_ = &out;
    if (exec(prog_.body) != Flow::kNormal) fail("{}: break or continue outside a loop", name_);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  const Program& prog_;
  const std::string& name_;
  std::optional<std::time_t> now_;
  std::vector<Frame*> scopes_;
  std::string* out_ = nullptr;
  int depth_ = 0;

  [[noreturn]] void error(size_t offset, std::string_view msg) const {
    fail("{}: {}", where(prog_.source, name_, offset), msg);
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      if (const auto f = (*it)->find(name); f != (*it)->end()) return f->second;
    }
    return global(name, now_);
  }

  Flow exec(const Body& body) {
    for (const auto& s : body) {
      const Flow f = exec(*s);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s) {
    try {
      return exec_inner(s);
    } catch (const ValueError& err) {
      error(s.offset, err.message);
    }
  }

  Flow exec_inner(const Stmt& s) {
    switch (s.kind) {
      case Stmt::Kind::kText:
        *out_ += s.text;
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        *out_ += to_str(eval(*s.expr));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.bodies.size(); ++i) {
          if (i >= s.conds.size() || truthy(eval(*s.conds[i]))) return exec(s.bodies[i]);
        }
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        return exec_for(s);
      case Stmt::Kind::kSet:
        exec_set(s);
        return Flow::kNormal;
      case Stmt::Kind::kMacro:
        define_macro(s);
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kGeneration:
        return exec(s.bodies[0]);
    }
    return Flow::kNormal;
  }

  void bind_targets(const Stmt& s, const std::vector<std::string>& targets, const Value& v,
                    Frame& frame) {
    if (targets.size() == 1) {
      frame[targets[0]] = v;
      return;
    }
    const List items = v.is_list() ? v.list() : iterate(v);
    if (items.size() != targets.size()) {
      error(s.offset,
            fmt::format("cannot unpack {} values into {} names", items.size(), targets.size()));
    }
    for (size_t i = 0; i < items.size(); ++i) frame[targets[i]] = items[i];
  }

  Flow exec_for(const Stmt& s) {
    const Value seq = eval(*s.expr);
    if (seq.is_none() || seq.is_number() || seq.is_callable()) {
      error(s.expr->offset, fmt::format("'{}' object is not iterable", type_name(seq)));
    }
    List items = iterate(seq);
    if (s.cond) {  // `for x in xs if c`: filtered before loop.* counts
      List kept;
      for (const auto& x : items) {
        Frame f;
        bind_targets(s, s.targets, x, f);
        scopes_.push_back(&f);
        const bool keep = truthy(eval(*s.cond));
        scopes_.pop_back();
        if (keep) kept.push_back(x);
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Frame f;
      bind_targets(s, s.targets, items[static_cast<size_t>(i)], f);
      std::vector<std::pair<std::string, Value>> loop = {
          {"index0", i},       {"index", i + 1},      {"revindex0", n - i - 1},
          {"revindex", n - i}, {"first", i == 0},     {"last", i == n - 1},
          {"length", n},       {"depth", int64_t{1}}, {"depth0", int64_t{0}}};
      if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      loop.emplace_back("cycle", Value(std::make_shared<const Callable>(Callable{
                                     "loop.cycle", [i](Args& a) -> Value {
                                       if (a.pos.empty())
                                         value_error("loop.cycle() needs at least one value");
                                       return a.pos[static_cast<size_t>(i) % a.pos.size()];
                                     }})));
      f["loop"] = make_dict(std::move(loop));
      scopes_.push_back(&f);
      const Flow flow = exec(s.bodies[0]);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    if (n == 0 && s.bodies.size() > 1) return exec(s.bodies[1]);
    return Flow::kNormal;
  }

  void exec_set(const Stmt& s) {
    Value v;
    if (s.expr) {
      v = eval(*s.expr);
    } else {
      std::string captured;
      std::string* saved = out_;
      out_ = &captured;
      const Flow f = exec(s.bodies[0]);
      out_ = saved;
      if (f != Flow::kNormal) error(s.offset, "break or continue inside a block set");
      v = std::move(captured);
    }
    if (!s.text.empty()) {
      const Value ns = lookup(s.targets[0]);
      if (!ns.is_dict() || !ns.dict().is_namespace) {
        error(s.offset,
              fmt::format(
                  "cannot assign attribute '{}' of '{}': only namespace() objects take attributes",
                  s.text, s.targets[0]));
      }
      ns.dict().set(s.text, std::move(v));
      return;
    }
    bind_targets(s, s.targets, v, *scopes_.back());
  }

  void define_macro(const Stmt& s) {
    auto fn = [this, &s](Args& a) -> Value { return call_macro(s, a); };
    (*scopes_.back())[s.text] = Value(std::make_shared<const Callable>(Callable{s.text, fn}));
  }

  Value call_macro(const Stmt& s, Args& a) {
    if (a.pos.size() > s.params.size()) {
      value_error(fmt::format("macro '{}' takes {} arguments ({} given)", s.text, s.params.size(),
                              a.pos.size()));
    }
    if (depth_ >= kMaxCallDepth)
      value_error(fmt::format("macro '{}': calls nested too deeply", s.text));
    Frame local;
    for (size_t i = 0; i < a.pos.size(); ++i) local[s.params[i].first] = a.pos[i];
    for (auto& kw : a.kw) {
      const std::string& k = kw.first;  // named: clang 14 lambdas cannot capture bindings
      const bool known = std::any_of(s.params.begin(), s.params.end(),
                                     [&](const auto& p) { return p.first == k; });
      if (!known) value_error(fmt::format("macro '{}' has no parameter named '{}'", s.text, k));
      local[k] = kw.second;
    }
    // A macro sees the template's top-level names, not its caller's locals.
    std::vector<Frame*> saved_scopes = {scopes_.front(), &local};
    std::swap(saved_scopes, scopes_);
    std::string captured;
    std::string* saved_out = out_;
    out_ = &captured;
    ++depth_;
    try {
      for (const auto& [p, def] : s.params) {
        if (!local.contains(p))
          local[p] = def ? eval(*def) : Value(Undefined{fmt::format("'{}' is undefined", p)});
      }
      exec(s.bodies[0]);
    } catch (...) {
      --depth_;
      out_ = saved_out;
      scopes_ = std::move(saved_scopes);
      throw;
    }
    --depth_;
    out_ = saved_out;
    scopes_ = std::move(saved_scopes);
    return captured;
  }

  // ---- expressions ----

  Value eval(const Expr& e) {
    try {
      return eval_inner(e);
    } catch (const ValueError& err) {
      error(e.offset, err.message);
    } catch (const TemplateRaised& r) {
      error(e.offset, "the template raised an error: " + r.message);
    }
  }

  Args eval_args(const Expr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
    return a;
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList: {
        List l;
        for (const auto& x : e.args) l.push_back(eval(*x));
        return e.name == "tuple" ? Value::tuple(std::move(l)) : Value(std::move(l));
      }
      case Expr::Kind::kDict: {
        auto d = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          if (!k.is_string())
            value_error(fmt::format("dict keys must be strings here, got {}", type_name(k)));
          d->set(k.str(), eval(*e.args[i + 1]));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::kAttr:
        return get_attr(eval(*e.args[0]), e.name);
      case Expr::Kind::kIndex:
        return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case Expr::Kind::kSlice:
        return slice(e);
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.args[0]);
        if (callee.is_undefined()) value_error(std::get<Undefined>(callee.data).what);
        if (!callee.is_callable())
          value_error(fmt::format("'{}' object is not callable", type_name(callee)));
        Args a = eval_args(e, 1);
        return callee.callable().fn(a);
      }
      case Expr::Kind::kFilter: {
        const Value subject = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return apply_filter(e.name, subject, a);
      }
      case Expr::Kind::kTest: {
        const Value subject = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return apply_test(e.name, subject, a) != e.negated;
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.args[0]);
        if (e.name == "not") return !truthy(v);
        if (!v.is_number())
          value_error(fmt::format("bad operand type for unary {}: '{}'", e.name, type_name(v)));
        if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
        return v.is_float() ? Value(-v.as_float()) : Value(-v.as_int());
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? eval(*e.args[1]) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.args[0]);
        return truthy(a) ? a : eval(*e.args[1]);
      }
      case Expr::Kind::kCondition:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2])
                         : Value(Undefined{"the conditional expression has no else"});
      case Expr::Kind::kBinary:
        return binary(e.name, eval(*e.args[0]), eval(*e.args[1]));
    }
    value_error("unknown expression");
  }

  Value slice(const Expr& e) {
    const Value obj = eval(*e.args[0]);
    if (obj.is_undefined()) value_error(std::get<Undefined>(obj.data).what);
    std::optional<int64_t> part[3];
    for (size_t i = 0; i < 3; ++i) {
      if (!e.args[i + 1]) continue;
      const Value v = eval(*e.args[i + 1]);
      if (v.is_none()) continue;
      if (!v.is_int() && !v.is_bool()) value_error("slice indices must be integers or None");
      part[i] = v.as_int();
    }
    const int64_t step = part[2].value_or(1);
    if (step == 0) value_error("slice step cannot be zero");
    const bool is_str = obj.is_string();
    if (!is_str && !obj.is_list())
      value_error(fmt::format("'{}' object is not subscriptable", type_name(obj)));
    const List items = is_str ? iterate(obj) : obj.list();
    const auto n = static_cast<int64_t>(items.size());
    // Python's slice.indices.
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v < 0 ? *v + n : *v;
      const int64_t lo = step > 0 ? 0 : -1, hi = step > 0 ? n : n - 1;
      return std::clamp(x, lo, hi);
    };
    const int64_t start = clamp(part[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(part[1], step > 0 ? n : -1);
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      out.push_back(items[static_cast<size_t>(i)]);
    if (!is_str) return out;
    std::string s;
    for (const auto& c : out) s += c.str();
    return s;
  }

  static Value arith(const std::string& op, const Value& a, const Value& b) {
    if (a.is_float() || b.is_float() || op == "/") {
      const double x = a.as_float(), y = b.as_float();
      if (op == "+") return x + y;
      if (op == "-") return x - y;
      if (op == "*") return x * y;
      if (op == "**") return std::pow(x, y);
      if (y == 0) value_error("division by zero");
      if (op == "/") return x / y;
      if (op == "//") return std::floor(x / y);
      const double m = std::fmod(x, y);
      return m != 0 && ((m < 0) != (y < 0)) ? m + y : m;
    }
    // Python's ints do not overflow; a template that leaves int64 is refused, not wrapped.
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t r = 1;
    auto checked = [&](bool overflowed) -> Value {
      if (overflowed) value_error(fmt::format("integer overflow in {} {} {}", x, op, y));
      return r;
    };
    if (op == "+") return checked(__builtin_add_overflow(x, y, &r));
    if (op == "-") return checked(__builtin_sub_overflow(x, y, &r));
    if (op == "*") return checked(__builtin_mul_overflow(x, y, &r));
    if (op == "**") {
      if (y < 0) return std::pow(static_cast<double>(x), static_cast<double>(y));
      // Squaring: base^2 divides the result whenever bits remain, so it overflows only if the
      // result would.
      bool overflowed = false;
      int64_t base = x;
      for (int64_t e = y; e > 0 && !overflowed; e >>= 1) {
        if (e & 1) overflowed = __builtin_mul_overflow(r, base, &r);
        if (e > 1 && !overflowed) overflowed = __builtin_mul_overflow(base, base, &base);
      }
      return checked(overflowed);
    }
    if (y == 0) value_error("integer division or modulo by zero");
    int64_t q = x / y, m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) {
      --q;
      m += y;
    }
    return op == "//" ? q : m;
  }

  static bool contains(const Value& container, const Value& item) {
    if (container.is_string()) {
      if (!item.is_string())
        value_error(
            fmt::format("'in <string>' requires string as left operand, not {}", type_name(item)));
      return container.str().find(item.str()) != std::string::npos;
    }
    if (container.is_dict())
      return item.is_string() && container.dict().find(item.str()) != nullptr;
    if (container.is_list()) {
      for (const auto& x : container.list()) {
        if (equal(x, item)) return true;
      }
      return false;
    }
    if (container.is_undefined()) return false;
    value_error(fmt::format("argument of type '{}' is not iterable", type_name(container)));
  }

  static Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") return to_str(a) + to_str(b);
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in") return contains(b, a);
    if (op == "not in") return !contains(b, a);
    for (const Value* v : {&a, &b}) {
      if (v->is_undefined()) value_error(std::get<Undefined>(v->data).what);
    }
    if (op == "<") return less(a, b);
    if (op == ">") return less(b, a);
    if (op == "<=") return !less(b, a);
    if (op == ">=") return !less(a, b);
    if (a.is_number() && b.is_number()) return arith(op, a, b);
    if (op == "+" && a.is_string() && b.is_string()) return a.str() + b.str();
    if (op == "+" && a.is_list() && b.is_list()) {
      List l = a.list();
      l.insert(l.end(), b.list().begin(), b.list().end());
      return l;
    }
    if (op == "*" && (a.is_string() || b.is_string()) && (a.is_int() || b.is_int())) {
      const std::string& s = a.is_string() ? a.str() : b.str();
      const int64_t n = a.is_int() ? a.as_int() : b.as_int();
      if (n > 0 && s.size() * static_cast<uint64_t>(n) > (uint64_t{64} << 20)) {
        value_error("string repetition longer than 64 MiB");
      }
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += s;
      return out;
    }
    if (op == "%" && a.is_string()) return percent_format(a.str(), b);
    value_error(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
                            type_name(b)));
  }
};

}  // namespace

std::string evaluate(const Program& program, const std::string& name,
                     const nlohmann::ordered_json& context, std::optional<std::time_t> now) {
  return Evaluator(program, name, now).run(context);
}

}  // namespace exl3::jinja
