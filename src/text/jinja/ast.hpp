// The parsed template: expression and statement trees. Every node keeps its source offset, so
// run-time errors can name the line and column.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.hpp"

namespace exl3::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // args; name "tuple" for a tuple literal
    kDict,       // args: key, value, key, value, ...
    kAttr,       // args[0].name
    kIndex,      // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (null parts are omitted)
    kCall,       // args[0](args[1..], kwargs)
    kFilter,     // args[0] | name(args[1..], kwargs)
    kTest,       // args[0] is [not] name(args[1..])   (negated)
    kUnary,      // op args[0]: "-", "+", "not"
    kBinary,     // args[0] op args[1]: + - * / // % ** ~ == != < <= > >= in "not in"
    kAnd,        // short-circuit
    kOr,         // short-circuit
    kCondition,  // args[0] if args[1] else args[2] (args[2] may be null: undefined)
  };
  Kind kind;
  size_t offset = 0;
  std::string name;  // name, attribute, filter, test or operator
  Value value;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // conds[i] -> bodies[i]; a last body without a condition is the else
    kFor,     // for targets in expr [if cond]: bodies[0]; else bodies[1]
    kSet,     // targets = expr; or target.attr = expr; or block set (bodies[0])
    kMacro,   // name(params = defaults): bodies[0]
    kBreak,
    kContinue,
    kGeneration,  // transformers' {% generation %}: renders its body unchanged
  };
  Kind kind;
  size_t offset = 0;
  std::string text;                  // kText; kSet: attribute name for ns.attr; kMacro: name
  std::vector<std::string> targets;  // kFor / kSet variable names
  ExprPtr expr, cond;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro: name, default (or null)
};

// A parsed template, shared by copies of jinja::Template.
struct Program {
  std::string source;  // normalized, for line:column of errors
  Body body;
};

// Parses normalized source; throws exl3::Error "name:line:col: ..." on any syntax error and on
// unknown tags, filters and tests.
Body parse(const std::string& source, const std::string& name);

}  // namespace exl3::jinja
