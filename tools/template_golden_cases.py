"""Inputs for tools/make_template_goldens.py: OpenAI chat requests and Jinja unit templates.

Only inputs live here; every expected output is rendered by jinja2 in make_template_goldens.py.
"""
import json

DEFAULT = {"bos_token": "", "eos_token": "<|im_end|>"}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a location. Returns \"temp\" & <units>.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City, e.g. Zürich or 東京"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
                "precision": {"type": "number", "multipleOf": 0.5},
                "options": {
                    "type": "object",
                    "properties": {
                        "hourly": {"type": "boolean"},
                        "fields": {"type": "array", "items": {"type": "string"}},
                        "extra": {"type": ["string", "null"]},
                    },
                    "required": ["hourly"],
                },
            },
            "required": ["location"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.\nUse sparingly.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "filters": {"type": "array", "items": {"type": "object", "properties": {
                    "key": {"type": "string"}, "value": {"type": "string"}}}},
            },
            "required": ["query"],
        },
    },
}
TOOLS = [WEATHER, SEARCH]


def call(name, args, cid="call_1", as_string=True):
    return {"id": cid, "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


def U(text):
    return {"role": "user", "content": text}


def A(text, **kw):
    return {"role": "assistant", "content": text, **kw}


def S(text):
    return {"role": "system", "content": text}


def T(text, cid="call_1", name=None):
    m = {"role": "tool", "tool_call_id": cid, "content": text}
    if name:
        m["name"] = name
    return m


def conversations():
    c = []

    def add(name, messages, options=None, **extra):
        c.append((name, {"model": "qwen3.6", "messages": messages, **extra}, options or dict(DEFAULT)))

    add("single_user", [U("Hello!")])
    add("system_user", [S("You are a helpful assistant."), U("Hi")])
    add("developer_role", [{"role": "developer", "content": "Be terse."}, U("Hi")])
    add("multi_turn", [S("sys"), U("What is 2+2?"), A("4"), U("And 3+3?")])
    add("thinking_off_kwargs", [U("Hi")], chat_template_kwargs={"enable_thinking": False})
    add("thinking_on_kwargs", [U("Hi")], chat_template_kwargs={"enable_thinking": True})
    add("thinking_override_off", [U("Hi")], {**DEFAULT, "enable_thinking": False},
        chat_template_kwargs={"enable_thinking": True})
    add("thinking_override_on", [U("Hi")], {**DEFAULT, "enable_thinking": True},
        chat_template_kwargs={"enable_thinking": False})
    add("reasoning_in_history", [U("q1"), A("a1", reasoning_content="thought 1"), U("q2")])
    add("reasoning_after_last_query",
        [U("q1"), A("a1", reasoning_content="\nthought 1\n")])
    add("think_tags_in_content", [U("q1"), A("<think>\nhidden\n</think>\n\nvisible"), U("q2")])
    add("think_tags_after_last_query", [U("q1"), A("<think>\nhidden\n</think>\n\nvisible")])
    add("reasoning_and_think_tags", [U("q1"), A("<think>x</think>y", reasoning_content="r")])
    add("preserve_thinking", [U("q1"), A("a1", reasoning_content="r1"), U("q2")],
        chat_template_kwargs={"preserve_thinking": True})
    add("tools_user", [U("Weather in Paris?")], tools=TOOLS)
    add("tools_system_user", [S("You can call tools."), U("Weather?")], tools=TOOLS)
    add("tools_empty_system", [S(""), U("Weather?")], tools=TOOLS)
    add("tools_empty_list", [U("Hi")], tools=[])
    add("tool_call_roundtrip", [
        U("Weather in Paris in 3 days, hourly?"),
        A(None, tool_calls=[call("get_weather", {"location": "Paris", "days": 3, "precision": 0.5,
                                                 "options": {"hourly": True, "fields": ["temp", "wind"], "extra": None}})]),
        T('{"temp": 21.5, "unit": "celsius"}'),
        A("It will be 21.5°C."),
        U("Thanks"),
    ], tools=TOOLS)
    add("tool_call_pending_response", [
        U("Weather?"),
        A("", tool_calls=[call("get_weather", {"location": "Oslo"})]),
        T("sunny", name="get_weather"),
    ], tools=TOOLS)
    add("multiple_tool_calls", [
        U("Weather in Paris and Rome?"),
        A("Let me check both.", tool_calls=[call("get_weather", {"location": "Paris"}, "c1"),
                                            call("get_weather", {"location": "Rome", "unit": "fahrenheit"}, "c2")]),
        T("18", "c1"), T("75", "c2"),
    ], tools=TOOLS)
    add("three_consecutive_tool_responses", [
        U("go"),
        A(None, tool_calls=[call("search", {"query": "a"}, "c1"), call("search", {"query": "b"}, "c2"),
                            call("search", {"query": "c"}, "c3")]),
        T("ra", "c1"), T("rb", "c2"), T("rc", "c3"),
        A("done"), U("next"),
    ], tools=TOOLS)
    add("tool_call_object_arguments", [
        U("Weather?"),
        A(None, tool_calls=[call("get_weather", {"location": "Paris", "days": 2}, as_string=False)]),
        T("ok"),
    ], tools=TOOLS)
    add("tool_call_empty_arguments", [U("x"), A(None, tool_calls=[call("search", {})]), T("r")], tools=TOOLS)
    add("tool_call_scalar_arguments", [U("x"), A(None, tool_calls=[call("search", {
        "query": "naïve café", "n": 5, "score": 0.25, "big": 1e20, "small": 1.5e-7, "neg": -3, "flag": False,
        "none": None, "list": [1, "two", 3.0], "nested": {"k": {"deep": ["x", {"y": 1}]}}, "quote": "say \"hi\"\n",
    })]), T("r")], tools=TOOLS)
    add("tool_call_unicode_keys", [U("x"), A(None, tool_calls=[call("search", {"查询": "東京 🌸", "émoji": "🙂"})]),
                                   T("r")], tools=TOOLS)
    add("multi_step_tools", [
        U("Plan a trip"),
        A("", reasoning_content="need weather", tool_calls=[call("get_weather", {"location": "Lima"}, "c1")]),
        T("warm", "c1"),
        A("", reasoning_content="now search", tool_calls=[call("search", {"query": "Lima hotels"}, "c2")]),
        T("hotel list", "c2"),
    ], tools=TOOLS)
    add("tool_response_json", [U("x"), A(None, tool_calls=[call("search", {"query": "q"})]),
                               T(json.dumps({"results": [{"title": "A", "url": "http://a"}]}))], tools=TOOLS)
    add("tools_without_tool_calls_history", [S("sys"), U("a"), A("b"), U("c")], tools=[SEARCH])
    add("unicode", [U("Grüße, 世界! 🚀 مرحبا e\u0301 \u200b tab\there"), A("Ça va? 👍"), U("✓")])
    add("empty_user_content", [U("")])
    add("empty_system_content", [S(""), U("Hi")])
    add("whitespace_content", [S("  sys  \n"), U("\n  padded question  \n\n")])
    add("array_content_parts", [{"role": "user", "content": [{"type": "text", "text": "Part one. "},
                                                             {"type": "text", "text": "Part two."}]}])
    add("array_content_system", [{"role": "system", "content": [{"type": "text", "text": "sys A"},
                                                               {"type": "text", "text": " sys B"}]}, U("q")])
    add("null_assistant_content", [U("q"), {"role": "assistant", "content": None}, U("q2")])
    add("user_looks_like_tool_response", [U("real question"), U("<tool_response>\nx\n</tool_response>")])
    add("template_like_text", [U("{{ not a template }} {% raw %} {# c #}"), A("{%- endif %}"), U("}}")])
    add("long_history", [S("sys")] + [m for k in range(6) for m in
                                      (U(f"question {k}"), A(f"answer {k}", reasoning_content=f"reason {k}"))]
        + [U("final")])
    add("ends_with_assistant", [U("q"), A("partial answer")])
    add("no_generation_prompt", [U("q"), A("a")], chat_template_kwargs={"add_generation_prompt": False})
    add("extra_kwargs", [U("q")], chat_template_kwargs={"custom_flag": True, "enable_thinking": False})
    add("bos_eos_tokens", [U("q")], {"bos_token": "<s>", "eos_token": "</s>"})
    add("system_not_first", [U("q"), S("late system"), U("q2")])
    add("no_user_message", [S("only system")])
    add("only_assistant", [A("hello")])
    add("empty_messages", [])
    add("only_tool_responses", [U("<tool_response>\nr\n</tool_response>")])
    add("unknown_role", [{"role": "narrator", "content": "x"}, U("q")])
    add("image_part", [{"role": "user", "content": [{"type": "text", "text": "see"},
                                                    {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    add("bad_arguments_json", [U("x"), A(None, tool_calls=[{"id": "c", "type": "function",
                                                             "function": {"name": "search", "arguments": "{bad"}}])])
    add("arguments_not_object", [U("x"), A(None, tool_calls=[{"id": "c", "type": "function",
                                                               "function": {"name": "search", "arguments": "[1, 2]"}}])])
    add("message_not_object", ["hello"])
    add("content_number", [{"role": "user", "content": 42}])
    return c


def unit_cases():
    """(name, template, context) triples exercising the interpreter; outputs come from jinja2."""
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}, {"role": "user", "content": "x"}]
    d = {"b": 2, "a": 1, "c": {"z": [1, 2], "y": None}}
    u = []

    def add(name, template, **ctx):
        u.append((name, template, ctx))

    # whitespace control, trim_blocks, lstrip_blocks
    add("ws_trim_blocks", "{% if true %}\nA\n{% endif %}\nB\n")
    add("ws_lstrip_blocks", "x\n    {% if true %}\n    y\n    {% endif %}\nz")
    add("ws_minus_both", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c")
    add("ws_var_minus", "a \n {{- 'b' -}} \n c {{ 'd' }} \n e")
    add("ws_plus_disables_lstrip", "x\n    {%+ if true %}y{% endif %}")
    add("ws_plus_disables_trim", "{% if true +%}\ny{% endif %}")
    add("ws_var_no_lstrip", "a\n    {{ 'b' }}\n    c")
    add("ws_lstrip_after_var_same_line", "{{ 'a' }}   {% if true %}b{% endif %}")
    add("ws_comment", "a\n  {# comment #}\nb{#- c -#}  \n c")
    add("ws_trailing_newline_dropped", "line\n")
    add("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc")
    add("ws_raw", "{% raw %}{{ x }}{% if %}{% endraw %}|{%- raw -%}  {{ y }}  {%- endraw -%}  |")
    add("ws_tabs_lstrip", "\t\t{% set x = 1 %}\n{{ x }}")
    add("ws_block_end_eats_one_newline", "{% set x = 1 %}\n\n{{ x }}")
    # loops
    add("loop_vars", "{% for x in items %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
        "{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", items=["a", "b", "c"])
    add("loop_prev_next", "{% for x in items %}[{{ loop.previtem }}<{{ x }}>{{ loop.nextitem }}]{% endfor %}",
        items=[1, 2, 3])
    add("loop_prev_next_defined", "{% for x in items %}{{ loop.previtem is defined }}{{ loop.nextitem is defined }},"
        "{% endfor %}", items=[1, 2])
    add("loop_else", "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}")
    add("loop_else_undefined", "{% for x in nothing %}{{ x }}{% else %}none{% endfor %}")
    add("loop_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }},{% endfor %}")
    add("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
        "{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}")
    add("loop_unpack_items", "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}", d=d)
    add("loop_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", d=d)
    add("loop_string", "{% for ch in 'héllo' %}{{ ch }}-{% endfor %}")
    add("loop_nested_loop_var", "{% for a in [1,2] %}{% set outer = loop %}{% for b in 'xy' %}"
        "{{ outer.index }}{{ loop.index }}{{ b }} {% endfor %}{% endfor %}")
    add("loop_cycle", "{% for x in range(5) %}{{ loop.cycle('a', 'b') }}{% endfor %}")
    add("loop_reversed_slice", "{% for m in messages[::-1] %}{{ m.content }}{{ loop.index0 }}{% endfor %}",
        messages=msgs)
    add("loop_dict_items_method", "{% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}", d=d)
    # scoping
    add("scope_loop_set_does_not_leak", "{% set x = 1 %}{% for i in [1,2] %}{{ x }}{% set x = 2 %}{{ x }}"
        "{% endfor %}{{ x }}")
    add("scope_loop_fresh_each_iteration", "{% set x = 1 %}{% for i in [1,2] %}{% if i == 2 %}{{ x }}{% endif %}"
        "{% set x = 5 %}{% endfor %}{{ x }}")
    add("scope_if_leaks", "{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}")
    add("scope_namespace", "{% set ns = namespace(n=0, s='') %}{% for i in range(4) %}{% set ns.n = ns.n + i %}"
        "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}")
    add("scope_macro_sees_later_global", "{% macro m() %}{{ x }}{% endmacro %}{% set x = 3 %}{{ m() }}")
    add("scope_macro_not_caller_locals", "{% macro m() %}[{{ x }}]{% endmacro %}{% for x in [7] %}{{ m() }}{% endfor %}")
    add("scope_with", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]")
    add("scope_tuple_set", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 'x' %}{{ t }}")
    add("set_block", "{% set x %}  inner {{ 1 + 1 }}  {% endset %}[{{ x }}]")
    add("set_block_filter", "{% set x | upper | trim %}  hello  {% endset %}[{{ x }}]")
    # macros
    add("macro_defaults", "{% macro f(a, b='B', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}"
        "{{ f(1) }}|{{ f(1, 2) }}|{{ f(1, c=3) }}|{{ f() }}")
    add("macro_returns_string_trim", "{% macro f(x) %}\n  {{ x }}  \n{% endmacro %}[{{ f('v')|trim }}]")
    add("macro_too_many_args", "{% macro f(a) %}{{ a }}{% endmacro %}{{ f(1, 2) }}")
    add("macro_recursive", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}"
        "{% endmacro %}{{ fact(5) }}")
    # if / conditional expressions
    add("if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %},"
        "{% endfor %}")
    add("cond_expr", "{{ 'y' if flag else 'n' }}{{ 'y' if not flag else 'n' }}[{{ 'z' if false }}]", flag=True)
    add("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ none or [] }} {{ '' and 1 }}")
    # operators
    add("arith", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} "
        "{{ 1 + 2.5 }} {{ 10 / 5 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ -(3) }} {{ 1 - -1 }} {{ 5.5 // 2 }} {{ -5.5 % 2 }}")
    add("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ 'a' ~ 1 * 2 }} {{ not 1 == 2 }} "
        "{{ -2 ** 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }}")
    add("concat_binds_tighter_than_plus", "{{ 'a' ~ 1 + 2 }}")
    add("concat_tilde", "{{ 'a' ~ 1 ~ none ~ true ~ 1.5 ~ undefined_thing }}")
    add("in_operator", "{{ 'a' in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'x' not in 'abc' }} "
        "{{ 'q' in missing }} {{ 1.0 in [1] }}")
    add("comparisons", "{{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ none == none }} "
        "{{ 'a' != 'a' }} {{ {'a': 1} == {'a': 1} }} {{ (1, 2) == [1, 2] }}")
    add("is_tests", "{{ x is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} {{ d is mapping }} "
        "{{ l is iterable }} {{ s is iterable }} {{ d is iterable }} {{ l is sequence }} {{ 3 is number }} "
        "{{ 3.5 is float }} {{ 3 is integer }} {{ true is boolean }} {{ true is true }} {{ 1 is true }} "
        "{{ false is false }} {{ 0 is false }} {{ l is not mapping }} {{ 3 is odd }} {{ 4 is even }} "
        "{{ 9 is divisibleby 3 }} {{ 'a' is in 'abc' }} {{ 2 is equalto 2 }} {{ 2 is eq 3 }} {{ 'abc' is lower }} "
        "{{ 'ABC' is upper }} {{ n is sameas none }} {{ x is callable }} {{ range is callable }} {{ y is iterable }} "
        "{{ 3 is gt 2 }} {{ 3 is le 2 }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ s is not none }}",
        x=1, n=None, s="str", d={"a": 1}, l=[1, 2])
    # filters
    add("filter_length_count", "{{ 'héllo'|length }} {{ [1,2]|count }} {{ d|length }} {{ missing|length }}", d=d)
    add("filter_trim", "[{{ '  x  '|trim }}][{{ 'xxhixx'|trim('x') }}][{{ '\u3000 y \n'|trim }}][{{ none|trim }}]")
    add("filter_string", "{{ 1|string }} {{ none|string }} {{ [1, 'a']|string }} {{ true|string }} [{{ missing|string }}]")
    add("filter_int_float", "{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} "
        "{{ true|int }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ none|int }} {{ '2.5'|float }} {{ 3|float }} "
        "{{ 'abc'|float }} {{ '-0'|int }}")
    add("filter_list", "{{ 'abc'|list }} {{ d|list }} {{ (1, 2)|list }}", d=d)
    add("filter_items", "{{ d|items|list }} {{ missing|items|list }}", d=d)
    add("filter_join", "{{ [1, 'a', none]|join(', ') }} {{ msgs|join('/', attribute='role') }} {{ 'abc'|join('-') }}",
        msgs=msgs)
    add("filter_default", "{{ missing|default('dflt') }} {{ ''|default('e', true) }} {{ ''|default('e') }} "
        "{{ none|default('n') }} {{ x|d('y') }}", x=0)
    add("filter_first_last", "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} "
        "[{{ []|first }}] {{ msgs|last|attr('content') }}", msgs=msgs)
    add("filter_map_select", "{{ msgs|map(attribute='role')|list }} {{ ['a', 'B']|map('upper')|join }} "
        "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} "
        "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }} "
        "{{ msgs|rejectattr('role', 'eq', 'user')|list|length }} {{ [0, 1, '', 'a', none]|select|list }} "
        "{{ msgs|selectattr('missing')|list }} {{ msgs|map(attribute='nope', default='-')|join }}", msgs=msgs)
    add("filter_case", "{{ 'hello wORLD'|upper }} {{ 'HeLLo'|lower }} {{ 'hello world'|title }} "
        "{{ 'hello World'|capitalize }} {{ 'ÉCOLE'|lower }} {{ \"they're bill's\"|title }}")
    add("filter_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }}")
    add("filter_tojson", "{{ d|tojson }}\n{{ d|tojson(indent=2) }}\n{{ d|tojson(sort_keys=true) }}\n"
        "{{ 'é\"<>&\\'\\n\\u0001'|tojson }} {{ [1.0, 1e20, 1.5e-7, -0.0, 3, true, none]|tojson }} "
        "{{ {}|tojson }} {{ []|tojson }} {{ 'é🙂'|tojson(ensure_ascii=true) }} {{ (1, 2)|tojson }}\n"
        "{{ {'a': [], 'b': {}}|tojson(indent=1) }}\n{{ d|tojson(separators=(',', ':')) }}", d=d)
    add("filter_tojson_undefined_error", "{{ missing|tojson }}")
    add("filter_safe_markup_add", "{{ ('<a>'|safe) + '<b>' }} {{ '<c>' ~ ('<d>'|safe) }} {{ '<e>'|escape }} "
        "{{ '<f>'|safe|tojson }}")
    add("filter_reverse_sort_unique", "{{ 'abc'|reverse }} {{ [3, 1, 2]|reverse|list }} {{ [3, 1, 2]|sort }} "
        "{{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [3, 1, 2]|sort(reverse=true) }} "
        "{{ msgs|sort(attribute='content')|map(attribute='content')|join }} {{ [1, 2, 1, 'a', 'A']|unique|list }}",
        msgs=msgs)
    add("filter_min_max_sum_abs_round", "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ [1, 2, 3]|sum }} "
        "{{ [1.5, 2]|sum }} {{ -3|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.567|round(2) }} {{ 2.1|round(0, 'ceil') }} "
        "{{ 2.9|round(method='floor') }} {{ 7|round }}")
    add("filter_indent", "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('>', blank=true) }}")
    add("filter_format", "{{ '%s-%d-%05.1f %%'|format('a', 3, 2.25) }} {{ '%s' % 'x' }} {{ '%(a)s'|format(a=1) }}")
    add("filter_dictsort", "{{ d|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }}", d={"b": 1, "A": 3, "a": 2})
    # string methods
    add("str_methods", "{{ 'abc'.startswith('a') }} {{ 'abc'.endswith(('x', 'c')) }} [{{ '  x '.strip() }}]"
        "[{{ 'xxhixx'.strip('x') }}][{{ '\n\nhi\n'.lstrip('\n') }}][{{ 'hi\n\n'.rstrip() }}] {{ 'a,b,,c'.split(',') }} "
        "{{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ 'a b c'.rsplit(none, 1) }} "
        "{{ 'a-b'.replace('-', '+') }} {{ 'Ab'.upper() }}{{ 'Ab'.lower() }} {{ 'ab cd'.title() }} {{ 'hello'.find('l') }} "
        "{{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }} "
        "{{ '{} and {}'.format('x', 'y') }} {{ '{0}{name}'.format(1, name='n') }} {{ '12'.isdigit() }} "
        "{{ 'ab'.isalpha() }} {{ 'a\nb\r\nc'.splitlines() }} {{ 'pre_x'.removeprefix('pre_') }} "
        "{{ 'héllo'.upper() }} {{ 'x'.capitalize() }} {{ ''.split(',') }} {{ ''.split() }}")
    add("str_think_split", "{% set c = m.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}[{{ c }}]"
        "[{{ m.split('</think>')[-1].lstrip('\\n') }}]", m="<think>\nreason\n</think>\n\nanswer")
    add("str_index_slice", "{{ s[0] }}{{ s[-1] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[::2] }}{{ s[10:] }}[{{ s[99] }}]"
        "{{ s[-2:] }}{{ s[:-2] }}", s="héllo")
    add("list_index_slice", "{{ l[0] }} {{ l[-1] }} {{ l[1:] }} {{ l[::-1] }} {{ l[5:] }} [{{ l[9] }}] {{ l[-9:2] }} "
        "{{ l[3:0:-1] }} {{ l.0 }}", l=[1, 2, 3, 4])
    add("dict_methods", "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 5) }} {{ d.keys()|list }} "
        "{{ d.values()|list }} {{ d['c']['z'][1] }} {{ d.c.z.1 }} [{{ d.nope }}] [{{ d['nope'] }}]", d=d)
    # printing Python values
    add("print_values", "{{ [1, 'a', none, true, 1.5, {'k': \"it's\"}] }} {{ (1,) }} {{ (1, 2) }} {{ d }} "
        "{{ 1e16 }} {{ 1e-5 }} {{ 0.0001 }} {{ 1/3 }} {{ 123456789.123456789 }} {{ 1e22 }} {{ 100.0 }} "
        "{{ 'a\\nb'|list }} {{ ['\\'', '\"'] }} {{ namespace(a=1) }}", d=d)
    add("print_unicode_repr", "{{ ['é', '\u200b', '\u00a0', 'tab\t', '\x7f'] }}")
    # undefined
    add("undefined_print_and_test", "[{{ missing }}][{{ missing is defined }}][{{ d.nope is defined }}]"
        "[{{ missing|length }}][{{ missing == missing }}][{{ 'a' in missing }}][{% for x in missing %}x{% endfor %}]", d=d)
    add("undefined_attr_error", "{{ missing.attr }}")
    add("undefined_nested_attr_error", "{{ d.nope.deeper }}", d=d)
    add("undefined_add_error", "{{ missing + 1 }}")
    add("undefined_call_error", "{{ missing() }}")
    add("none_attr_is_undefined", "[{{ n.attr }}][{{ n.attr is defined }}]", n=None)
    # errors
    add("raise_exception", "{% if true %}{{ raise_exception('Custom failure: ' ~ 42) }}{% endif %}")
    add("type_error_str_plus_int", "{{ 'a' + 1 }}")
    add("type_error_in_none", "{{ 'a' in n }}", n=None)
    add("type_error_compare", "{{ 'a' < 1 }}")
    add("zero_division", "{{ 1 / 0 }}")
    add("items_non_mapping_error", "{{ [1]|items|list }}")
    add("iterate_int_error", "{% for x in 5 %}{% endfor %}")
    add("ns_assign_error", "{% set x = 1 %}{% set x.y = 2 %}")
    add("unpack_error", "{% for a, b in [[1, 2, 3]] %}{% endfor %}")
    # load errors
    add("load_unclosed_if", "{% if true %}x")
    add("load_unknown_filter", "{{ x|nosuchfilter }}")
    add("load_unknown_test", "{{ x is nosuchtest }}")
    add("load_bad_end", "{% for x in y %}{% endif %}")
    add("load_unclosed_var", "{{ x ")
    add("load_unclosed_string", "{{ 'abc }}")
    add("load_unknown_tag", "{% frobnicate %}")
    add("load_break_outside_loop", "{% break %}")
    # misc globals
    add("globals_range_dict", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} "
        "{{ dict(a=1, b='x') }} {{ strftime_now('%Y')|length }}")
    add("generation_tag", "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]"
        "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}", messages=msgs)
    add("string_literals", "{{ 'a\\tb' }}|{{ \"q'\" }}|{{ 'x' 'y' }}|{{ '\\u00e9\\x41' }}|{{ 'a\\qb' }}")
    add("number_literals", "{{ 1_000 }} {{ 1.5e3 }} {{ 0.5 }} {{ 12 }} {{ 1e2 }}")
    add("list_dict_literals", "{{ [1, [2, 3], {'a': (4, 5)}] }} {{ {'x': 1, 'y': [1,]}|tojson }} {{ () }} {{ [] }}")
    add("nested_quotes_in_tag", "{{ '}}' }}{{ \"%}\" }}{% set s = '{% x %}' %}{{ s }}")
    add("dict_brace_in_var", "{{ {'a': {'b': 1}} }}")
    return u


def more_unit_cases():
    """Second batch: edge semantics the chat templates lean on."""
    u = []

    def add(name, template, **ctx):
        u.append((name, template, ctx))

    add("macro_mutates_outer_namespace", "{% set c = namespace(n=0) %}{% macro bump() %}{% set c.n = c.n + 1 %}"
        "{{ c.n }}{% endmacro %}{{ bump() }}{{ bump() }}|{{ c.n }}")
    add("macro_set_does_not_leak", "{% set x = 1 %}{% macro m() %}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}")
    add("macro_kwarg_unknown_error", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}")
    add("filtered_loop_previtem", "{% for x in range(6) if x is even %}{{ loop.previtem }}/{{ x }}/{{ loop.nextitem }}"
        " {{ loop.revindex }};{% endfor %}")
    add("tuple_iteration", "{% for a, b in [(1, 2), (3, 4)] %}{{ a * b }},{% endfor %}{% for k, v in {'x': 1}.items() %}"
        "{{ k }}{{ v }}{% endfor %}")
    add("loop_over_values", "{% for v in d.values() %}{{ v }}{% endfor %}", d={"a": 1, "b": [2]})
    add("ws_start_minus", "   {{- 'a' }}\n   {%- if true %}b{% endif %}")
    add("ws_minus_no_ws", "{% if true -%}x{%- endif %}y")
    add("ws_comment_lstrip_and_trim", "a\n    {# note #}\nb\n  {#- n -#}\n  c")
    add("ws_unicode_space_lstrip", "a\n\u3000 {% if true %}b{% endif %}")
    add("ws_multiline_tag", "{% if\n  true\n  and\n  1 %}\nyes\n{% endif %}")
    add("ws_nested_blocks", "<ul>\n{% for i in [1, 2] %}\n  {% if i > 1 %}\n  <li>{{ i }}</li>\n  {% endif %}\n"
        "{% endfor %}\n</ul>\n")
    add("comment_with_tags_inside", "a{# {{ x }} {% if %} #}b")
    add("not_in_precedence", "{{ not 'a' in 'abc' }} {{ not 1 == 1 and true }} {{ 1 in [1] == true }}")
    add("test_precedence", "{{ 'a' ~ 'b' is string }} {{ not x is defined }} {{ -1 is number }} {{ x is not none or 1 }}",
        x=None)
    add("condexpr_with_filters", "{% for v in ['s', 1, {'a': 'é'}] %}{{ v|string if v is string else v|tojson|safe }};"
        "{% endfor %}")
    add("string_plus_filters", "{{ 5|string + 'a' }} {{ '%s|%s'|format(none, true) }} {{ 0.1 + 0.2 }} {{ -0.0 }} "
        "{{ 3 / 4 }} {{ 2 ** 0.5 }}")
    add("length_none_error", "{{ none|length }}")
    add("items_namespace_error", "{{ namespace(a=1)|items|list }}")
    add("undefined_compare_error", "{{ missing < 1 }}")
    add("undefined_attr_in_test_error", "{% if missing.attr is defined %}x{% endif %}")
    add("undefined_iterable_and_string", "{{ missing is iterable }} {{ missing is string }} {{ missing is mapping }} "
        "{{ missing is none }} {{ missing is sequence }}")
    add("list_attr_undefined", "[{{ [1].foo }}][{{ (1).bar }}][{{ 'x'.nope }}]")
    add("get_item_fallbacks", "[{{ {'a': 1}['b'] }}][{{ [1, 2][5] }}][{{ 'ab'[7] }}][{{ n[0] }}]", n=None)
    add("dict_key_order", "{{ d|tojson }} {% for k in d %}{{ k }}{% endfor %} {{ d|list }}", d={"z": 1, "a": 2, "m": 3})
    add("json_escapes", "{{ s|tojson }}", s="tab\t nl\n cr\r bs\\ q\" bell\u0007 del\u007f nbsp\u00a0 ls\u2028 😀")
    add("big_numbers", "{{ n }} {{ n|tojson }} {{ f|tojson }} {{ f }} {{ g }} {{ g|tojson }}", n=9007199254740993,
        f=123456789012345680000.0, g=0.1)
    add("string_compare_unicode", "{{ 'é' > 'z' }} {{ ['b', 'é', 'a']|sort }} {{ 'Z' < 'a' }}")
    add("startswith_tuple_and_slices", "{{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'[-2:] }} {{ 'abc'[:-1] }} "
        "{{ 'abcdef'[1:5:2] }} {{ 'abcdef'[5:1:-2] }} {{ [1, 2, 3][::-2] }}")
    add("split_maxsplit_ws", "{{ '  a  b  c  '.split(none, 1) }} {{ '  a  b  c  '.rsplit(none, 1) }} "
        "{{ 'a,b,c'.rsplit(',', 1) }} {{ 'abc'.split('b') }} {{ 'a\u3000b'.split() }}")
    add("strip_chars_unicode", "[{{ '«x»'.strip('«»') }}][{{ '\u00a0 x\u2003'.strip() }}][{{ 'xyx'.rstrip('x') }}]")
    add("raise_in_macro", "{% macro check(x) %}{% if x is not string %}{{ raise_exception('bad type: ' ~ x) }}"
        "{% endif %}{{ x }}{% endmacro %}{{ check('ok') }}{{ check(3) }}")
    add("raise_non_string", "{{ raise_exception(42) }}")
    add("join_nonstring_error", "{{ ', '.join([1, 2]) }}")
    add("set_in_if_inside_loop", "{% for i in [1, 2] %}{% if i == 1 %}{% set y = 'one' %}{% endif %}[{{ y }}]{% endfor %}")
    add("loop_in_macro_in_loop", "{% macro row(items) %}{% for x in items %}{{ loop.index }}{{ x }}{% endfor %}"
        "{% endmacro %}{% for r in [['a'], ['b', 'c']] %}{{ loop.index }}:{{ row(r) }};{% endfor %}")
    add("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns.c is defined }}")
    add("default_on_none_attr", "{{ m.content|default('x') }} {{ m.missing|default('y') }} {{ m.none|default('z') }}",
        m={"content": "c", "none": None})
    add("trim_filter_on_markup", "[{{ (' a '|safe)|trim }}]")
    add("select_map_on_falsy", "{{ none|select('odd')|list }} {{ 0|map(attribute='x')|list }} "
        "{{ false|selectattr('a')|list }} {{ ''|reject|list }}")
    add("unhashable_in_dict_error", "{{ [1] in {'a': 1} }}")
    add("unique_unhashable_error", "{{ [{'a': 1}]|unique|list }}")
    add("callable_undefined", "{{ missing is callable }} {{ 'x' is callable }}")
    add("odd_even_float", "{{ 2.5 is even }} {{ 3.0 is odd }} {{ 4.0 is even }} {{ 7.5 is divisibleby 2.5 }}")
    add("indent_non_string_error", "{{ 5|indent }}")
    add("percent_mapping_like", "{{ 'ab' % [1] }} {{ 'ab' % {'k': 1} }} {{ '%s' % [1, 2] }} {{ 'n' % missing }}")
    add("percent_extra_args_error", "{{ 'ab' % 5 }}")
    add("generator_truthiness", "{{ 'T' if []|select else 'F' }}{{ 'T' if m|selectattr('role', 'eq', 'x') else 'F' }}"
        "{{ 'T' if m|selectattr('role', 'eq', 'x')|list else 'F' }}{{ 'T' if {}|items else 'F' }}"
        "{{ 'T' if []|reverse else 'F' }} {{ m|map(attribute='role')|join('+') }} {{ (m|map(attribute='role'))[0] }}|"
        "{{ m|selectattr('role')|first }} {{ [3, 1]|unique|sort }} {{ d|dictsort|length }} {{ m|reverse|list|length }}",
        m=[{"role": "user"}, {"role": "assistant"}], d={"b": 1, "a": 2})
    add("generator_length_error", "{{ [1, 2]|select|length }}")
    add("generator_tojson_error", "{{ [1, 2]|map('string')|tojson }}")
    add("generator_last_error", "{{ [1, 2]|select|last }}")
    add("generator_loop", "{% for x in [1, 2, 3]|select('odd') %}{{ x }}{{ loop.length }}{{ loop.last }},{% endfor %}"
        "{% for k, v in {'a': 1}|items %}{{ k }}{{ v }}{% endfor %}{{ [1, 2]|select is sequence }}"
        "{{ [1, 2]|select is iterable }} {{ 1 in [1, 2]|select }}")
    add("macro_infinite_recursion_error", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
    add("int_filter_edge", "{{ '0x1A'|int }} {{ '1e3'|int }} {{ '-12'|int }} {{ '+7'|int }} {{ ''|int }} {{ '3.'|int }}")
    return u


def snippet_cases():
    """Idioms from other widely used HF chat templates (Llama 3.x, Mistral, Gemma, DeepSeek)."""
    msgs = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo", "tool_calls": [
                {"id": "abcdefghijkl", "type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": "é"}}}]},
            {"role": "tool", "tool_call_id": "abcdefghijkl", "content": {"ok": True}}, {"role": "user", "content": "x"}]
    tools = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string"}}}}}]
    u = []

    def add(name, template, **ctx):
        u.append((name, template, ctx))

    add("llama_system_extract", "{{- bos_token }}\n{%- if messages[0]['role'] == 'system' %}\n"
        "    {%- set system_message = messages[0]['content']|trim %}\n    {%- set messages = messages[1:] %}\n"
        "{%- else %}\n    {%- set system_message = \"\" %}\n{%- endif %}\n[{{ system_message }}]{{ messages|length }}",
        bos_token="<|begin_of_text|>", messages=msgs)
    add("llama_tools_indent", "{%- for t in tools %}\n    {{- t | tojson(indent=4) }}\n    {{- \"\\n\\n\" }}\n"
        "{%- endfor %}\n{{- builtin_tools | reject('equalto', 'code_interpreter') | join(\", \") }}",
        tools=tools, builtin_tools=["brave_search", "code_interpreter", "wolfram_alpha"])
    add("llama_tool_call_json", "{%- for message in messages %}{%- if message.tool_calls is defined %}"
        "{%- set tool_call = message.tool_calls[0].function %}{{- '{\"name\": \"' + tool_call.name + '\", ' }}"
        "{{- '\"parameters\": ' }}{{- tool_call.arguments | tojson }}{{- \"}\" }}{%- endif %}"
        "{%- if message.role == 'tool' %}{%- if message.content is mapping or message.content is iterable %}"
        "{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}{%- endif %}{%- endfor %}",
        messages=msgs)
    add("llama_date", "{%- if not date_string is defined %}{%- set date_string = strftime_now(\"%d %b %Y\") %}"
        "{%- endif %}{{ date_string|length >= 10 }}|{%- set date_string = '26 Jul 2024' %}{{ date_string }}")
    add("gemma_alternation", "{%- for message in messages[1:] %}{%- if (message['role'] == 'user') != "
        "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/"
        "assistant/...') }}{%- endif %}{{ message['role'] }} {% endfor %}", messages=msgs[:3])
    add("gemma_alternation_error", "{%- for message in messages %}{%- if (message['role'] == 'user') != "
        "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/"
        "assistant/...') }}{%- endif %}{% endfor %}", messages=msgs)
    add("mistral_ids", "{%- for message in messages %}{%- if message.tool_calls is defined %}{%- for tc in "
        "message.tool_calls %}{%- if not tc.id is defined or tc.id|length < 9 %}{{- raise_exception('bad id') }}"
        "{%- endif %}{{ tc.id[-9:] }}{%- endfor %}{%- endif %}{%- if loop.last and system_message is defined %}"
        "[SYS]{%- endif %}{%- endfor %}", messages=msgs)
    add("deepseek_namespace", "{% set ns = namespace(is_first=false, is_tool=false, system_prompt='') %}"
        "{%- for message in messages %}{%- if message['role'] == 'system' %}{% set ns.system_prompt = "
        "message['content'] %}{%- endif %}{%- endfor %}{{ ns.system_prompt }}{%- for message in messages %}"
        "{%- if message['role'] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%}"
        "{%- elif message['role'] == 'assistant' %}{% set content = message['content'] %}{% if '</think>' in content %}"
        "{% set content = content.split('</think>')[-1] %}{% endif %}{{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}"
        "{%- endif %}{%- endfor %}", messages=msgs)
    add("selectattr_system", "{{ messages|selectattr('role', 'equalto', 'system')|list|length }} "
        "{{ (messages|selectattr('role', 'eq', 'user')|first).content }} {{ messages|map(attribute='role')|unique|join(',') }}",
        messages=msgs)
    add("content_string_length", "{% for m in messages %}{{ m.content|string|length }},{% endfor %}", messages=msgs)
    add("loop_last_not_first", "{% for m in messages %}{{ '\\n' if not loop.first }}{{ m.role }}{{ '.' if loop.last }}"
        "{% endfor %}", messages=msgs)
    return u
