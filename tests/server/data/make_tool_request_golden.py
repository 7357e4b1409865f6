#!/usr/bin/env python3
"""Writes golden_tool_requests.json for tests/server/tool_request_golden_test.cpp.

Each case is an OpenAI /v1/chat/completions body (text, so its key order is what a client sent)
with tools and tool traffic, and the prompt transformers renders for it with one of the repo's
chat templates (tests/text/data/chat_templates). The test feeds the body through the server's
request parser and exl3's template renderer and wants the same bytes: so the server hands the
template what transformers would get.

What transformers gets is the OpenAI messages, except that a call's `arguments` (JSON text in the
API) is decoded to the object it encodes, which is how templates expect it and what vLLM passes;
a `developer` turn is a `system` turn, and text parts are joined. The tools go over as sent.

The committed file was produced with transformers==5.24.0, jinja2==3.1.6 (Python 3.11):

    python3 -m venv /tmp/venv-tools && /tmp/venv-tools/bin/pip install transformers jinja2 tokenizers
    /tmp/venv-tools/bin/python tests/server/data/make_tool_request_golden.py
"""
import json
from pathlib import Path

import jinja2
import transformers
from transformers import PreTrainedTokenizerFast

HERE = Path(__file__).resolve().parent
TEXT_DATA = HERE.parent.parent / "text" / "data"
OUT = HERE / "golden_tool_requests.json"

FAMILIES = {
    "chatml_tools": ("chatml_tools.jinja", None, "<|im_end|>"),
    "llama31_style": ("llama31_style.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral_style": ("mistral_style.jinja", "<s>", "</s>"),
}

WEATHER = ('{"type": "function", "function": {"name": "get_weather", "description": "Météo — current weather", '
           '"parameters": {"type": "object", "required": ["city"], "properties": {"unit": {"type": "string", '
           '"enum": ["celsius", "fahrenheit"]}, "city": {"type": "string", "description": "e.g. \\"Zürich\\""}}}}}')
SEARCH = ('{"type": "function", "function": {"parameters": {"properties": {"q": {"type": "string"}, '
          '"limit": {"type": "integer", "minimum": 1}}, "type": "object"}, "name": "search", "strict": false}}')

CASES = [
    ("chatml_tools", "two_calls_and_results", f"""{{"messages": [
  {{"role": "developer", "content": "Be brief."}},
  {{"role": "user", "content": [{{"type": "text", "text": "Weather in Zürich "}}, {{"type": "text", "text": "and news?"}}]}},
  {{"role": "assistant", "content": null, "tool_calls": [
    {{"id": "call_1", "type": "function", "function": {{"name": "get_weather", "arguments": "{{\\"unit\\": \\"celsius\\", \\"city\\": \\"Zürich\\"}}"}}}},
    {{"id": "call_2", "type": "function", "function": {{"name": "search", "arguments": "{{\\"q\\": \\"news {{today}}\\", \\"limit\\": 3, \\"extra\\": [1.5, null, true]}}"}}}}]}},
  {{"role": "tool", "tool_call_id": "call_1", "content": "-3 °C"}},
  {{"role": "tool", "tool_call_id": "call_2", "content": "[\\"a\\", \\"b\\"]"}},
  {{"role": "assistant", "content": "Cold; two stories."}},
  {{"role": "user", "content": "Thanks"}}],
 "tools": [{WEATHER}, {SEARCH}]}}"""),
    ("chatml_tools", "content_and_call", f"""{{"messages": [
  {{"role": "user", "content": "Search it"}},
  {{"role": "assistant", "content": "Let me look.", "tool_calls": [
    {{"id": "c", "type": "function", "function": {{"name": "search", "arguments": "{{}}"}}}}]}},
  {{"role": "tool", "tool_call_id": "c", "content": "nothing"}}],
 "tools": [{SEARCH}], "chat_template_kwargs": {{"enable_thinking": false}}}}"""),
    ("chatml_tools", "tool_choice_none", f"""{{"messages": [{{"role": "user", "content": "Hi"}}],
 "tools": [{WEATHER}], "tool_choice": "none"}}"""),
    ("chatml_tools", "no_tools", """{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]}"""),
    ("llama31_style", "call_and_result", f"""{{"messages": [
  {{"role": "system", "content": "You help."}},
  {{"role": "user", "content": "Weather in Oslo?"}},
  {{"role": "assistant", "tool_calls": [{{"id": "call_9", "type": "function",
    "function": {{"name": "get_weather", "arguments": "{{\\"city\\": \\"Oslo\\", \\"unit\\": \\"celsius\\"}}"}}}}]}},
  {{"role": "tool", "tool_call_id": "call_9", "content": "-3"}}],
 "tools": [{WEATHER}, {SEARCH}], "chat_template_kwargs": {{"date_string": "02 Dec 2026"}}}}"""),
    ("llama31_style", "tools_in_system", f"""{{"messages": [{{"role": "user", "content": "Find cats"}}],
 "tools": [{SEARCH}], "chat_template_kwargs": {{"date_string": "02 Dec 2026", "tools_in_user_message": false}}}}"""),
    ("mistral_style", "calls_and_results", f"""{{"messages": [
  {{"role": "system", "content": "Sys"}},
  {{"role": "user", "content": "Weather and news"}},
  {{"role": "assistant", "content": null, "tool_calls": [
    {{"id": "aB3dE5gH7", "type": "function", "function": {{"name": "get_weather", "arguments": "{{\\"city\\": \\"Paris\\"}}"}}}},
    {{"id": "Zz9Yy8Xx7", "type": "function", "function": {{"name": "search", "arguments": "{{\\"q\\": \\"news\\"}}"}}}}]}},
  {{"role": "tool", "tool_call_id": "aB3dE5gH7", "content": "12 C"}},
  {{"role": "tool", "tool_call_id": "Zz9Yy8Xx7", "content": "none"}},
  {{"role": "assistant", "content": "Mild, quiet."}},
  {{"role": "user", "content": "And tomorrow?"}}],
 "tools": [{WEATHER}, {SEARCH}]}}"""),
]


def template_messages(body):
    out = []
    for m in body["messages"]:
        m = dict(m)
        if m["role"] == "developer":
            m["role"] = "system"
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        for call in m.get("tool_calls") or []:
            if isinstance(call["function"].get("arguments"), str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
        out.append(m)
    return out


def main():
    cases = []
    for family, name, text in CASES:
        body = json.loads(text)  # dicts keep the order of the text
        path, bos, eos = FAMILIES[family]
        special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
        tok = PreTrainedTokenizerFast(tokenizer_file=str(TEXT_DATA / "qwen2_style" / "tokenizer.json"), **special)
        expected = tok.apply_chat_template(
            template_messages(body), tools=body.get("tools"), add_generation_prompt=True, tokenize=False,
            chat_template=(TEXT_DATA / "chat_templates" / path).read_text(encoding="utf-8"),
            **body.get("chat_template_kwargs", {}))
        cases.append({"template": path, "name": f"{family}/{name}", "bos_token": bos, "eos_token": eos,
                      "body": text, "expected": expected})
    doc = {"generator": "tests/server/data/make_tool_request_golden.py", "transformers": transformers.__version__,
           "jinja2": jinja2.__version__, "cases": cases}
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT.name}: {len(cases)} cases")


if __name__ == "__main__":
    main()
