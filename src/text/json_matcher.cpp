// The incremental JSON matcher and the vocabulary trie walk (see json_schema.hpp).
//
// A state is a set of parses ("threads"), each a stack of frames, so alternatives (anyOf, enum
// values sharing a prefix, optional properties) are followed together until bytes tell them
// apart; a byte advances every thread, threads it does not fit die, and equal threads merge.
#include <algorithm>

#include "exl3/text/json_schema.hpp"
#include "exl3/text/tokenizer.hpp"

namespace exl3 {

namespace {

using Kind = JsonGrammar::Kind;
using Frame = JsonMatcher::Frame;
using Thread = JsonMatcher::Thread;
using State = JsonMatcher::State;

enum FrameKind : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral, kKey };
// Object phases: after '{', after a key (':' next), after a value, after ','.
enum : uint8_t { kObjOpen, kObjColon, kObjAfterValue, kObjComma };
// Array phases: after '[', after an item, after ','.
enum : uint8_t { kArrOpen, kArrAfterValue, kArrComma };
// String phases: plain text, after '\', in \uXXXX (a: hex digits left), in a UTF-8 sequence
// (a: continuation bytes left, b: the next byte's range, low | high << 8).
enum : uint8_t { kStrText, kStrEscape, kStrHex, kStrUtf8 };
// Number phases; kNumZero, kNumInt, kNumFrac and kNumExpDigits may end the number.
enum : uint8_t {
  kNumMinus,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumExp,
  kNumExpSign,
  kNumExpDigits
};

constexpr int32_t kAnyContainer = -1;    // an object or array frame of a kAny value
constexpr int kMaxDigits = 16;           // per integer or fraction part
constexpr int kMaxExpDigits = 2;         // so a number stays within a double (|x| < 1e116)
constexpr int kMaxAlternativeHops = 16;  // anyOf nested in anyOf (a cycle of them ends here)

bool is_space(uint8_t c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool number_may_end(const Frame& f) {
  return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac ||
         f.phase == kNumExpDigits;
}

// The threads one byte leads to, from one thread at a time.
class Stepper {
 public:
  Stepper(const JsonGrammar& g, State& out) : g_(g), out_(out) {}

  void advance(Thread t, uint8_t c) {
    if (t.empty()) return;  // a complete value: nothing may follow
    switch (t.back().kind) {
      case kValue: {
        if (space(t, c)) return;
        const int32_t node = t.back().node;
        t.pop_back();
        start(std::move(t), node, c, 0);
        return;
      }
      case kObject:
        return object(std::move(t), c);
      case kArray:
        return array(std::move(t), c);
      case kString:
        return string(std::move(t), c);
      case kNumber:
        return number(std::move(t), c);
      case kLiteral:
      case kKey:
        return literal(std::move(t), c);
      default:
        return;
    }
  }

 private:
  void emit(Thread&& t) { out_.push_back(std::move(t)); }

  // Pushes a frame unless the parse is already as deep as allowed (the thread then dies).
  static bool push(Thread& t, Frame f) {
    if (t.size() >= static_cast<size_t>(JsonMatcher::kMaxDepth)) return false;
    t.push_back(f);
    return true;
  }

  // White space in a gap: true when `c` is white space (kept while the gap has room).
  bool space(Thread& t, uint8_t c) {
    if (!is_space(c)) return false;
    if (t.back().space < JsonMatcher::kMaxSpace) {
      ++t.back().space;
      emit(std::move(t));
    }
    return true;
  }

  // `c` is the first byte of a value of `node`, which `t` expects next.
  void start(Thread t, int32_t node, uint8_t c, int hops) {
    const auto& n = g_.nodes[static_cast<size_t>(node)];
    switch (n.kind) {
      case Kind::kAny:
        if (c == '{') return open(std::move(t), kObject, kAnyContainer);
        if (c == '[') return open(std::move(t), kArray, kAnyContainer);
        if (c == '"') return open(std::move(t), kString, 0);
        if (c == '-' || is_digit(c)) return begin_number(std::move(t), c, false);
        return start(std::move(t), 1, c, hops + 1);  // true, false, null
      case Kind::kObject:
        if (c == '{') open(std::move(t), kObject, n.any_keys ? kAnyContainer : node);
        return;
      case Kind::kArray:
        if (c == '[') open(std::move(t), kArray, node);
        return;
      case Kind::kString:
        if (c == '"') open(std::move(t), kString, node);
        return;
      case Kind::kNumber:
      case Kind::kInteger:
        if (c == '-' || is_digit(c)) begin_number(std::move(t), c, n.kind == Kind::kInteger);
        return;
      case Kind::kLiterals:
        for (size_t i = 0; i < n.literals.size(); ++i) {
          const std::string& lit = n.literals[i];
          if (lit.empty() || static_cast<uint8_t>(lit[0]) != c) continue;
          Thread u = t;
          if (lit.size() == 1 || push(u, {kLiteral, 0, 0, 0, node, static_cast<int32_t>(i), 1})) {
            emit(std::move(u));
          }
        }
        return;
      case Kind::kAlternatives:
        if (hops >= kMaxAlternativeHops) return;
        for (const int32_t alt : n.alternatives) start(t, alt, c, hops + 1);
        return;
    }
  }

  void open(Thread t, uint8_t kind, int32_t node) {
    if (push(t, {kind, 0, 0, 0, node, 0, 0})) emit(std::move(t));
  }

  void begin_number(Thread t, uint8_t c, bool integer) {
    Frame f{kNumber, kNumMinus, 0, 0, 0, 0, integer ? 1 : 0};
    if (c == '0') f.phase = kNumZero;
    if (c >= '1' && c <= '9') f.phase = kNumInt, f.a = 1;
    if (push(t, f)) emit(std::move(t));
  }

  // Whether the object of frame `f` may end here: no required property left.
  bool may_close(const Frame& f) const {
    if (f.node == kAnyContainer) return true;
    const auto& props = g_.nodes[static_cast<size_t>(f.node)].properties;
    for (size_t j = static_cast<size_t>(f.a); j < props.size(); ++j) {
      if (props[j].required) return false;
    }
    return true;
  }

  void object(Thread t, uint8_t c) {
    Frame& f = t.back();
    if (space(t, c)) return;
    const auto phase = f.phase;
    if (phase == kObjColon) {
      if (c != ':') return;
      const int32_t value = f.b;
      f.phase = kObjAfterValue, f.space = 0;
      if (push(t, {kValue, 0, 0, 0, value, 0, 0})) emit(std::move(t));
      return;
    }
    if (c == '}' && (phase == kObjOpen || phase == kObjAfterValue)) {
      if (!may_close(f)) return;
      t.pop_back();
      return emit(std::move(t));
    }
    if (phase == kObjAfterValue) {
      if (c != ',') return;
      const bool more =
          f.node == kAnyContainer ||
          static_cast<size_t>(f.a) < g_.nodes[static_cast<size_t>(f.node)].properties.size();
      if (!more) return;
      f.phase = kObjComma, f.space = 0;
      return emit(std::move(t));
    }
    if (c != '"') return;  // kObjOpen or kObjComma: a key next
    f.phase = kObjColon, f.space = 0;
    if (f.node == kAnyContainer) {
      f.b = 0;  // any value
      if (push(t, {kString, kStrText, 0, 0, 0, 0, 0})) emit(std::move(t));
      return;
    }
    // The keys that may come next: the properties in order, up to the first required one.
    const int32_t node = f.node;
    const auto& props = g_.nodes[static_cast<size_t>(node)].properties;
    for (size_t j = static_cast<size_t>(f.a); j < props.size(); ++j) {
      Thread u = t;
      if (push(u, {kKey, 0, 0, 0, node, static_cast<int32_t>(j), 1})) emit(std::move(u));
      if (props[j].required) break;
    }
  }

  void array(Thread t, uint8_t c) {
    Frame& f = t.back();
    if (space(t, c)) return;
    const bool any = f.node == kAnyContainer;
    const auto* n = any ? nullptr : &g_.nodes[static_cast<size_t>(f.node)];
    const int64_t min = any ? 0 : n->min_items;
    const int64_t max = any ? -1 : n->max_items;
    const int32_t items = any ? 0 : n->items;
    if (f.phase == kArrAfterValue) {
      if (c == ']' && f.a >= min) {
        t.pop_back();
        emit(std::move(t));
      } else if (c == ',' && (max < 0 || f.a < max)) {
        f.phase = kArrComma, f.space = 0;
        emit(std::move(t));
      }
      return;
    }
    if (c == ']') {
      if (f.phase == kArrOpen && min == 0) {
        t.pop_back();
        emit(std::move(t));
      }
      return;
    }
    if (f.phase == kArrOpen && max == 0) return;
    ++f.a;
    f.phase = kArrAfterValue, f.space = 0;
    start(std::move(t), items, c, 0);
  }

  void string(Thread t, uint8_t c) {
    Frame& f = t.back();
    switch (f.phase) {
      case kStrText:
        if (c == '"') {
          t.pop_back();
        } else if (c == '\\') {
          f.phase = kStrEscape;
        } else if (c < 0x20) {
          return;
        } else if (c >= 0x80) {
          // UTF-8: the lead byte fixes the count and the next byte's range (no overlong forms,
          // no surrogates, nothing past U+10FFFF).
          int lo = 0x80, hi = 0xBF, more = 0;
          if (c >= 0xC2 && c <= 0xDF) {
            more = 1;
          } else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
          } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
          } else {
            return;
          }
          f.phase = kStrUtf8, f.a = more, f.b = lo | hi << 8;
        }
        return emit(std::move(t));
      case kStrEscape:
        if (c == 'u') {
          f.phase = kStrHex, f.a = 4;
        } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
                   c == 'r' || c == 't') {
          f.phase = kStrText;
        } else {
          return;
        }
        return emit(std::move(t));
      case kStrHex:
        // A lone surrogate would make the text invalid; D800..DFFF are left out whole.
        if (!is_hex(c) || (f.a == 4 && (c == 'd' || c == 'D'))) return;
        if (--f.a == 0) f.phase = kStrText;
        return emit(std::move(t));
      case kStrUtf8:
        if (c < (f.b & 0xFF) || c > (f.b >> 8)) return;
        f.b = 0x80 | 0xBF << 8;
        // Back in plain text the frame is as before the character, so states inside a string
        // compare equal (a caller may reuse the last mask).
        if (--f.a == 0) f.phase = kStrText, f.b = 0;
        return emit(std::move(t));
      default:
        return;
    }
  }

  void number(Thread t, uint8_t c) {
    Frame& f = t.back();
    const bool integer = f.b != 0;
    const bool exp = (c == 'e' || c == 'E') && !integer;
    bool took = true;
    switch (f.phase) {
      case kNumMinus:
        if (c == '0') {
          f.phase = kNumZero;
        } else if (c >= '1' && c <= '9') {
          f.phase = kNumInt, f.a = 1;
        } else {
          return;
        }
        break;
      case kNumZero:
      case kNumInt:
        if (f.phase == kNumInt && is_digit(c) && f.a < kMaxDigits) {
          ++f.a;
        } else if (c == '.' && !integer) {
          f.phase = kNumDot, f.a = 0;
        } else if (exp) {
          f.phase = kNumExp;
        } else {
          took = false;
        }
        break;
      case kNumDot:
        if (!is_digit(c)) return;
        f.phase = kNumFrac, f.a = 1;
        break;
      case kNumFrac:
        if (is_digit(c) && f.a < kMaxDigits) {
          ++f.a;
        } else if (exp) {
          f.phase = kNumExp;
        } else {
          took = false;
        }
        break;
      case kNumExp:
        if (c == '+' || c == '-') {
          f.phase = kNumExpSign;
        } else if (is_digit(c)) {
          f.phase = kNumExpDigits, f.a = 1;
        } else {
          return;
        }
        break;
      case kNumExpSign:
        if (!is_digit(c)) return;
        f.phase = kNumExpDigits, f.a = 1;
        break;
      case kNumExpDigits:
        if (is_digit(c) && f.a < kMaxExpDigits) {
          ++f.a;
        } else {
          took = false;
        }
        break;
      default:
        return;
    }
    if (took) return emit(std::move(t));
    // The number ended just before `c`, which belongs to what contains it.
    t.pop_back();
    advance(std::move(t), c);
  }

  void literal(Thread t, uint8_t c) {
    Frame& f = t.back();
    const auto& n = g_.nodes[static_cast<size_t>(f.node)];
    const bool key = f.kind == kKey;
    const std::string& lit =
        key ? n.properties[static_cast<size_t>(f.a)].key : n.literals[static_cast<size_t>(f.a)];
    if (static_cast<size_t>(f.b) >= lit.size() ||
        static_cast<uint8_t>(lit[static_cast<size_t>(f.b)]) != c)
      return;
    if (static_cast<size_t>(++f.b) < lit.size()) return emit(std::move(t));
    const int32_t prop = f.a;
    t.pop_back();
    if (key) {
      // The key is whole: its value comes after ':', and only later properties after that.
      Frame& o = t.back();
      o.phase = kObjColon, o.space = 0;
      o.a = prop + 1;
      o.b = n.properties[static_cast<size_t>(prop)].node;
    }
    emit(std::move(t));
  }

  const JsonGrammar& g_;
  State& out_;
};

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonGrammar> grammar) : g_(std::move(grammar)) {
  // Innermost last: the prefix's text, the value, then the suffix's text.
  Thread t;
  if (g_->suffix >= 0) t.push_back({kLiteral, 0, 0, 0, g_->suffix, 0, 0});
  t.push_back({kValue, 0, 0, 0, g_->root, 0, 0});
  if (g_->prefix >= 0) t.push_back({kLiteral, 0, 0, 0, g_->prefix, 0, 0});
  state_.push_back(std::move(t));
}

bool JsonMatcher::step(const State& from, uint8_t c, State& to) const {
  to.clear();
  Stepper s(*g_, to);
  for (const Thread& t : from) s.advance(t, c);
  if (to.size() > 1) {
    std::sort(to.begin(), to.end());
    to.erase(std::unique(to.begin(), to.end()), to.end());
    // A bound on the work per byte; parses past it are dropped, which only narrows the output.
    if (to.size() > kMaxThreads) to.resize(kMaxThreads);
  }
  return !to.empty();
}

bool JsonMatcher::feed(std::string_view bytes) {
  State cur = state_, next;
  for (const char ch : bytes) {
    if (!step(cur, static_cast<uint8_t>(ch), next)) return false;
    std::swap(cur, next);
  }
  state_ = std::move(cur);
  return true;
}

bool JsonMatcher::complete() const {
  return std::any_of(state_.begin(), state_.end(), [](const Thread& t) {
    return t.empty() || (t.size() == 1 && t[0].kind == kNumber && number_may_end(t[0]));
  });
}

bool JsonMatcher::finished() const {
  return !state_.empty() &&
         std::all_of(state_.begin(), state_.end(), [](const Thread& t) { return t.empty(); });
}

void JsonMatcher::allowed_tokens(const TokenTrie& trie, std::vector<uint8_t>& allowed) const {
  allowed.assign(trie.vocab_size_, 0);
  if (trie.nodes_.empty()) return;
  // Depth-first over the trie; states[d] is the state after the first d bytes of the path.
  std::vector<State> states(1, state_);
  struct Pos {
    uint32_t node, edge;
  };
  std::vector<Pos> path{{0, 0}};
  while (!path.empty()) {
    const size_t d = path.size() - 1;
    const TokenTrie::Node& n = trie.nodes_[path.back().node];
    if (path.back().edge == n.num_edges) {
      path.pop_back();
      continue;
    }
    const TokenTrie::Edge e = trie.edges_[n.first_edge + path.back().edge++];
    if (states.size() <= d + 1) states.emplace_back();
    if (!step(states[d], e.byte, states[d + 1])) continue;
    const TokenTrie::Node& child = trie.nodes_[e.child];
    for (uint32_t k = 0; k < child.num_tokens; ++k)
      allowed[static_cast<size_t>(trie.tokens_[child.first_token + k])] = 1;
    path.push_back({e.child, 0});
  }
}

}  // namespace exl3
