"""Pure-Python checks and notes for a golden directory (no torch needed): the tensor inventory an MLX
qwen3_5_moe checkpoint must hold (from docs/model-spec §1.2, independent of the writer), and the
README.md rendered from config.json + expected.json."""
import json
import os

from mlx_format import GROUP, read_safetensors_header


def expected_inventory(cfg):
    """config.json dict -> {tensor name: (dtype, shape)} that the MLX layout prescribes."""
    t = cfg["text_config"]
    H, V, E = t["hidden_size"], t["vocab_size"], t["num_experts"]
    I, SI = t["moe_intermediate_size"], t["shared_expert_intermediate_size"]
    hd, nh, nkv = t["head_dim"], t["num_attention_heads"], t["num_key_value_heads"]
    kd = t["linear_num_key_heads"] * t["linear_key_head_dim"]
    nv, dv = t["linear_num_value_heads"], t["linear_value_head_dim"]
    vd = nv * dv
    conv = 2 * kd + vd
    K = t["linear_conv_kernel_dim"]
    inv = {}

    def q(name, out, inp, bits=4, lead=()):
        inv[name + ".weight"] = ("U32", [*lead, out, inp * bits // 32])
        inv[name + ".scales"] = ("BF16", [*lead, out, inp // GROUP])
        inv[name + ".biases"] = ("BF16", [*lead, out, inp // GROUP])

    P = "language_model.model."
    q(P + "embed_tokens", V, H)
    q("language_model.lm_head", V, H)
    inv[P + "norm.weight"] = ("BF16", [H])
    for i, lt in enumerate(t["layer_types"]):
        L = f"{P}layers.{i}."
        inv[L + "input_layernorm.weight"] = ("BF16", [H])
        inv[L + "post_attention_layernorm.weight"] = ("BF16", [H])
        if lt == "full_attention":
            q(L + "self_attn.q_proj", nh * hd * 2, H)
            q(L + "self_attn.k_proj", nkv * hd, H)
            q(L + "self_attn.v_proj", nkv * hd, H)
            q(L + "self_attn.o_proj", H, nh * hd)
            inv[L + "self_attn.q_norm.weight"] = ("BF16", [hd])
            inv[L + "self_attn.k_norm.weight"] = ("BF16", [hd])
        else:
            A = L + "linear_attn."
            q(A + "in_proj_qkv", conv, H)
            q(A + "in_proj_z", vd, H)
            q(A + "in_proj_b", nv, H)
            q(A + "in_proj_a", nv, H)
            q(A + "out_proj", H, vd)
            inv[A + "conv1d.weight"] = ("BF16", [conv, K, 1])
            inv[A + "A_log"] = ("F32", [nv])
            inv[A + "dt_bias"] = ("BF16", [nv])
            inv[A + "norm.weight"] = ("BF16", [dv])
        M = L + "mlp."
        q(M + "gate", E, H, bits=8)
        q(M + "switch_mlp.gate_proj", I, H, lead=(E,))
        q(M + "switch_mlp.up_proj", I, H, lead=(E,))
        q(M + "switch_mlp.down_proj", H, I, lead=(E,))
        q(M + "shared_expert.gate_proj", SI, H)
        q(M + "shared_expert.up_proj", SI, H)
        q(M + "shared_expert.down_proj", H, SI)
        q(M + "shared_expert_gate", 1, H, bits=8)
    return inv


def check_dir(d):
    """Compares model.safetensors' header with the prescribed inventory. -> list of problems."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    header, start = read_safetensors_header(os.path.join(d, "model.safetensors"))
    want = expected_inventory(cfg)
    problems = []
    for name, (dt, shape) in want.items():
        if name not in header:
            problems.append(f"missing {name}")
        elif header[name]["dtype"] != dt or header[name]["shape"] != shape:
            problems.append(f"{name}: {header[name]['dtype']} {header[name]['shape']}, want {dt} {shape}")
    problems += [f"unexpected {n}" for n in header if n not in want]
    size = os.path.getsize(os.path.join(d, "model.safetensors"))
    end = max(v["data_offsets"][1] for v in header.values())
    if start + end != size:
        problems.append(f"file size {size} != header end {start + end}")
    return problems


def render_readme(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    ex = json.load(open(os.path.join(d, "expected.json")))
    t = cfg["text_config"]
    n_attn = sum(1 for x in t["layer_types"] if x == "full_attention")
    attn_at = [i for i, x in enumerate(t["layer_types"]) if x == "full_attention"]
    v = ex["versions"]
    sizes = {f: os.path.getsize(os.path.join(d, f)) for f in ("model.safetensors", "expected.json", "config.json")}
    cases = ", ".join(str(c["prompt_len"]) for c in ex["cases"])
    fragile = sum(1 for c in ex["cases"] for s in c["steps"] if s["margin"] <= 0.02)
    total = sum(len(c["steps"]) for c in ex["cases"])
    lines = [
        f"# {os.path.basename(os.path.normpath(d))}: a random qwen3_5_moe checkpoint with transformers' answers",
        "",
        f"Preset `{ex['preset']}`, seed {ex['seed']}, made by `tools/make_golden.py --preset {ex['preset']} "
        f"--seed {ex['seed']} --out DIR` (python {v['python']}, torch {v['torch']}, transformers "
        f"{v['transformers']}, numpy {v['numpy']}) on {ex['device']} in {ex['dtype']}.",
        "",
        "## Model",
        f"- hidden {t['hidden_size']}, {t['num_hidden_layers']} layers, full attention at {attn_at} "
        f"({n_attn} layers; `full_attention_interval` {t['full_attention_interval']}), the rest Gated DeltaNet; "
        f"vocab {t['vocab_size']}.",
        f"- attention: {t['num_attention_heads']} query heads, {t['num_key_value_heads']} kv heads, head_dim "
        f"{t['head_dim']} (rotary dim {int(t['head_dim'] * t['rope_parameters']['partial_rotary_factor'])}, "
        f"theta {t['rope_parameters']['rope_theta']:g}), output gate.",
        f"- DeltaNet: {t['linear_num_key_heads']} key heads x {t['linear_key_head_dim']}, "
        f"{t['linear_num_value_heads']} value heads x {t['linear_value_head_dim']}, conv kernel "
        f"{t['linear_conv_kernel_dim']}.",
        f"- MoE: {t['num_experts']} experts, top-{t['num_experts_per_tok']}, expert intermediate "
        f"{t['moe_intermediate_size']}, shared expert intermediate {t['shared_expert_intermediate_size']}.",
        f"- eos ids {cfg['eos_token_id']}: {ex['notes']['eos']}",
        "",
        "## Files",
        f"- `model.safetensors` ({sizes['model.safetensors']} bytes, sha256 "
        f"`{ex['checkpoint']['sha256']['model.safetensors']}`): the MLX layout of Qwen3.6-35B-A3B-4bit. "
        "Quantized linears (embed_tokens and lm_head included) as U32 codes packed low bits first along "
        "the input dim, BF16 scales and biases per group of 64; `mlp.gate` and `shared_expert_gate` 8-bit, "
        "the rest 4-bit; experts as `switch_mlp.{gate,up,down}_proj` [E, out, in]; conv1d [C, K, 1]; "
        "input/post-attention/final/q/k norms stored as 1 + w_HF; the DeltaNet gated norm plain; A_log F32.",
        "- `config.json`: the MLX wrapper (text_config, top-level eos list, quantization with per-module "
        "8-bit overrides and its quantization_config duplicate).",
        f"- `expected.json` ({sizes['expected.json']} bytes): transformers' answers, same fields as "
        "`../shared/data/golden-small-seed7/expected.json`.",
        "",
        "## How the answers were made",
        f"{ex['checkpoint']['weights']}.",
        f"HF class `{ex['hf_class']}`; implementations that ran (call counts): "
        f"`{json.dumps(ex['hf_implementations'], sort_keys=True)}`.",
        f"Cases (prompt lengths {cases}; random token ids, no tokenizer): {ex['notes']['generation']}. "
        f"Per step: the chosen id, its logprob, `margin` (top-1 minus top-2 logit) and the top-8 "
        f"[id, logprob]; {ex['notes']['logprob']}. `forced_last_logits`: {ex['notes']['forced_last_logits']}.",
        f"Steps with margin <= 0.02: {fragile} of {total}; smallest margin {ex['summary']['min_margin']:.3g} "
        f"at {ex['summary']['min_margin_at']}.",
        "",
        "## Self-checks (recorded in expected.json)",
    ]
    for k, val in ex["self_checks"].items():
        lines.append(f"- {k}: {json.dumps(val)}")
    env_path = os.path.join(d, "envelope.json")
    if os.path.exists(env_path):
        env = json.load(open(env_path))
        v = env["versions"]
        lines += [
            "",
            "## The precision budget (envelope.json)",
            f"Transformers' own half-precision runs of this model, made by `tools/make_golden.py --envelope DIR` "
            f"on {env['device']} (torch {v['torch']}, transformers {v['transformers']}): {env['method']}.",
            "",
            "| run | top-1 agree | max delta | median delta | forced max | forced rms |",
            "|---|---|---|---|---|---|",
        ]
        for name, r in env["runs"].items():
            lines.append(f"| {name} | {r['top1_agree']}/{r['top1_compared']} | {r['max_delta']:.3g} | "
                         f"{r['median_delta']:.3g} | {r['forced_max']:.3g} | {r['forced_rms']:.3g} |")
        lines += [
            "",
            "## How to compare",
            "tests/golden/golden_test.cpp feeds the golden ids and holds every backend to the fp16 row: top-1 "
            "agreement no lower, max and median delta and the forced logits' errors no higher "
            "(../shared/docs/precision.md).",
            "",
        ]
    else:
        lines += [
            "",
            "## How to compare",
            "A bf16 engine may legitimately flip a greedy pick whose margin is tiny: tests/golden/golden_test.cpp "
            "compares ids only where the margin exceeds 0.02 (and otherwise feeds the golden id), logprobs at "
            "the golden top-8 within 0.03, and the forced logits within the tolerance stated there.",
            "",
        ]
    with open(os.path.join(d, "README.md"), "w") as f:
        f.write("\n".join(lines))
