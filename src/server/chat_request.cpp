// Chat messages and tools of a chat request (see chat_request.hpp).
#include "chat_request.hpp"

#include <algorithm>
#include <set>
#include <string>

#include <fmt/format.h>

namespace exl3::server {

using ojson = nlohmann::ordered_json;

ApiError bad_param(std::string param, std::string message) {
  ApiError e;  // status 400
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

namespace {

std::string type_name(const ojson& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  return fmt::format("a{} {}", v.is_array() || v.is_object() ? "n" : "", v.type_name());
}

const ojson* member(const ojson& o, const char* key) {
  const auto it = o.find(key);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

// A string, or a list of text parts joined; nullopt for anything else.
std::optional<std::string> text_content(const ojson& content) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return std::nullopt;
  std::string out;
  for (const auto& part : content) {
    const ojson* type = part.is_object() ? member(part, "type") : nullptr;
    const ojson* text = part.is_object() ? member(part, "text") : nullptr;
    if (!type || *type != "text" || !text || !text->is_string()) return std::nullopt;
    out += text->get<std::string>();
  }
  return out;
}

// Nesting depth of a JSON value (a scalar is 0), counted only up to `limit` + 1.
int depth(const ojson& v, int limit) {
  if (limit < 0 || !v.is_structured()) return 0;
  int deepest = 0;
  for (const auto& x : v) deepest = std::max(deepest, depth(x, limit - 1));
  return deepest + 1;
}

// How deep tool schemas and call arguments may nest: the template walks them recursively, and
// real schemas stay far below this.
constexpr int kMaxToolDepth = 32;

// OpenAI's rule for function names; templates print them unquoted in places.
bool valid_function_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (const char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

// An assistant turn's tool_calls for the template: arguments arrive as JSON text (OpenAI's form)
// and are handed over as the object they encode, as transformers expects and vLLM does.
std::optional<ApiError> template_tool_calls(const ojson& calls, size_t i, ojson& out) {
  auto fail = [&](const std::string& why) {
    return bad_param("messages", fmt::format("item {}: tool_calls {}", i, why));
  };
  if (!calls.is_array()) return fail(fmt::format("must be a list, got {}", type_name(calls)));
  out = ojson::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const ojson& c = calls[k];
    if (!c.is_object()) return fail(fmt::format("item {} must be an object", k));
    if (const ojson* t = member(c, "type"); t && *t != "function")
      return fail(fmt::format("item {}: type must be \"function\"", k));
    if (const ojson* id = member(c, "id"); id && !id->is_string())
      return fail(fmt::format("item {}: id must be a string", k));
    const ojson* fn = member(c, "function");
    if (!fn || !fn->is_object())
      return fail(fmt::format("item {} needs a 'function' object with name and arguments", k));
    const ojson* name = member(*fn, "name");
    if (!name || !name->is_string() || name->get_ref<const std::string&>().empty())
      return fail(fmt::format("item {}: function.name must be a non-empty string", k));
    const ojson* args = member(*fn, "arguments");
    ojson parsed = ojson::object();
    if (args && args->is_string()) {
      parsed = ojson::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_object()) {
        return fail(fmt::format(
            "item {}: function.arguments must be a JSON object written as a string, got {}", k,
            args->dump()));
      }
    } else if (args && args->is_object()) {
      parsed = *args;
    } else if (args) {
      return fail(
          fmt::format("item {}: function.arguments must be a string holding a JSON object", k));
    }
    if (depth(parsed, kMaxToolDepth) > kMaxToolDepth) {
      return fail(fmt::format("item {}: function.arguments nest more than {} levels deep", k,
                              kMaxToolDepth));
    }
    ojson call = c;
    call["function"]["arguments"] = std::move(parsed);
    out.push_back(std::move(call));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_chat_messages(const ojson& body, CompletionRequest& r) {
  const ojson* m = member(body, "messages");
  if (!m)
    return bad_param("messages",
                     "'messages' is required (a list of {\"role\", \"content\"} objects)");
  if (!m->is_array())
    return bad_param("messages", fmt::format("'messages' must be a list, got {}", type_name(*m)));
  if (m->empty()) return bad_param("messages", "'messages' is empty");
  for (size_t i = 0; i < m->size(); ++i) {
    auto fail = [&](const std::string& why) {
      return bad_param("messages", fmt::format("'messages' item {}{}", i, why));
    };
    const ojson& msg = (*m)[i];
    if (!msg.is_object()) return fail(fmt::format(" must be an object, got {}", type_name(msg)));
    const ojson* role = member(msg, "role");
    if (!role || !role->is_string()) return fail(" needs a string 'role'");
    ChatMessage cm;
    cm.role = role->get<std::string>();
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" &&
        cm.role != "developer" && cm.role != "tool") {
      return fail(fmt::format(
          ": role '{}' is not supported (system, developer, user, assistant, tool)", cm.role));
    }
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for the system turn
    ojson out = ojson::object();
    out["role"] = cm.role;
    const ojson* calls = cm.role == "assistant" ? member(msg, "tool_calls") : nullptr;
    if (calls && calls->is_array() && calls->empty()) calls = nullptr;
    const ojson* content = member(msg, "content");
    if (!content && !calls) return fail(" has no 'content'");
    if (content) {
      auto text = text_content(*content);
      if (!text) {
        return fail(fmt::format(
            ": 'content' must be a string or a list of text parts ({{\"type\": \"text\", "
            "\"text\": ...}}), got {}",
            type_name(*content)));
      }
      cm.content = std::move(*text);
      out["content"] = cm.content;
    } else {
      out["content"] = nullptr;  // an assistant turn that only calls tools, as OpenAI sends it
    }
    if (const ojson* name = member(msg, "name")) {
      if (!name->is_string()) return fail(": 'name' must be a string");
      out["name"] = *name;
    }
    if (calls) {
      ojson tc;
      if (auto e = template_tool_calls(*calls, i, tc)) return e;
      out["tool_calls"] = std::move(tc);
      r.has_tool_traffic = true;
    }
    if (cm.role == "tool") {
      const ojson* id = member(msg, "tool_call_id");
      if (!id || !id->is_string())
        return fail(": a tool message needs a string 'tool_call_id' (the call it answers)");
      out["tool_call_id"] = *id;
      r.has_tool_traffic = true;
    }
    r.messages.push_back(std::move(cm));
    r.template_messages.push_back(std::move(out));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_tools(const ojson& body, CompletionRequest& r) {
  if (const ojson* p = member(body, "parallel_tool_calls")) {
    if (!p->is_boolean())
      return bad_param("parallel_tool_calls", "'parallel_tool_calls' must be true or false");
    r.parallel_tool_calls = p->get<bool>();
  }
  std::set<std::string> names;
  if (const ojson* t = member(body, "tools")) {
    if (!t->is_array())
      return bad_param("tools", fmt::format("'tools' must be a list, got {}", type_name(*t)));
    for (size_t i = 0; i < t->size(); ++i) {
      auto fail = [&](const std::string& why) {
        return bad_param("tools", fmt::format("'tools' item {}{}", i, why));
      };
      const ojson& tool = (*t)[i];
      if (!tool.is_object())
        return fail(fmt::format(" must be an object, got {}", type_name(tool)));
      const ojson* type = member(tool, "type");
      if (!type || *type != "function")
        return fail(": 'type' must be \"function\" (the only kind of tool)");
      const ojson* fn = member(tool, "function");
      if (!fn || !fn->is_object()) return fail(" needs a 'function' object");
      const ojson* name = member(*fn, "name");
      if (!name || !name->is_string() || !valid_function_name(name->get<std::string>())) {
        return fail(": function.name must be 1 to 64 letters, digits, underscores or dashes");
      }
      if (!names.insert(name->get<std::string>()).second)
        return fail(
            fmt::format(": the function name '{}' is used twice", name->get<std::string>()));
      if (const ojson* d = member(*fn, "description"); d && !d->is_string())
        return fail(": function.description must be a string");
      if (const ojson* p = member(*fn, "parameters"); p && !p->is_object())
        return fail(": function.parameters must be a JSON schema object");
      if (depth(tool, kMaxToolDepth) > kMaxToolDepth)
        return fail(fmt::format(" nests more than {} levels deep", kMaxToolDepth));
      if (const ojson* s = member(*fn, "strict"); s && !s->is_boolean())
        return fail(": function.strict must be true or false");
      if (const ojson* s = member(*fn, "strict"); s && s->get<bool>()) r.strict_tools = true;
    }
    if (!t->empty()) r.tools = *t;
  }
  r.tool_choice = r.tools.is_null() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (const ojson* c = member(body, "tool_choice")) {
    if (*c == "none") {
      r.tool_choice = ToolChoice::kNone;
    } else if (*c == "auto") {
      if (r.tools.is_null()) {
        return bad_param("tool_choice", "'tool_choice' is \"auto\" but the request has no 'tools'");
      }
    } else if (*c == "required" || c->is_object()) {
      if (c->is_object()) {
        const ojson* fn = member(*c, "function");
        const ojson* name = fn && fn->is_object() ? member(*fn, "name") : nullptr;
        if (member(*c, "type") == nullptr || *member(*c, "type") != "function" || !name ||
            !name->is_string()) {
          return bad_param("tool_choice",
                           "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                           "\"function\", \"function\": {\"name\": ...}}");
        }
        if (!names.contains(name->get<std::string>())) {
          return bad_param("tool_choice",
                           fmt::format("'tool_choice' names the function '{}', which "
                                       "is not in 'tools'",
                                       name->get<std::string>()));
        }
        r.tool_choice = ToolChoice::kFunction;
        r.tool_choice_function = name->get<std::string>();
      } else {
        if (r.tools.is_null())
          return bad_param("tool_choice",
                           "'tool_choice' is \"required\" but the request has no 'tools'");
        r.tool_choice = ToolChoice::kRequired;
      }
    } else {
      return bad_param("tool_choice",
                       "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                       "\"function\", \"function\": {\"name\": ...}}");
    }
  }
  return std::nullopt;
}

}  // namespace exl3::server
