#!/usr/bin/env python3
"""Golden oracle for lily: builds a small random qwen3_5_moe model in HF transformers, quantizes its
weights to MLX affine 4/8-bit so that transformers and the MLX checkpoint hold exactly the same values,
writes the checkpoint in the MLX layout, and records transformers' greedy tokens, top-8 logprobs and
teacher-forced logits (float32, CPU, eager attention/experts, pure-torch DeltaNet).

  python3 tools/make_golden.py --preset small --seed 11 --out tests/data/golden/small-seed11
  python3 tools/make_golden.py --readme DIR     # (re)write DIR/README.md from its json files
  python3 tools/make_golden.py --check DIR      # tensor inventory of DIR/model.safetensors vs config
  python3 tools/make_golden.py --envelope DIR   # transformers' own fp16/bf16 error on DIR -> DIR/envelope.json
Needs torch, transformers (>= 5 with qwen3_5_moe), numpy and safetensors; --readme/--check need none.
"""
import argparse
import importlib.util
import json
import math
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_layout  # noqa: E402
import mlx_format as mf  # noqa: E402

# Presets: every input dim of a quantized linear (H, heads*head_dim, value dim, intermediates) is a
# multiple of 64. Sizes are kept small so that all committed goldens stay under 10 MB.
PRESETS = {
    # Real head geometry (head_dim 256, rotary 64, DeltaNet 128/128), 8 layers, 4 experts top-2.
    "small": dict(hidden_size=256, num_hidden_layers=8, full_attention_interval=4, vocab_size=512,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=256,
                  linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=128,
                  linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                  mrope_section=[11, 11, 10]),
    # Hidden 320 (5 groups), 3 attention layers of 6 (interval 2), GQA 3, head_dim 64 (rotary 16),
    # DeltaNet key dim 32 != value dim 64 with 2x value heads, 16 experts top-4, shared expert wider.
    "wide": dict(hidden_size=320, num_hidden_layers=6, full_attention_interval=2, vocab_size=2048,
                 num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                 linear_value_head_dim=64, linear_conv_kernel_dim=4, num_experts=16,
                 num_experts_per_tok=4, moe_intermediate_size=64, shared_expert_intermediate_size=128,
                 mrope_section=[3, 3, 2]),
}
PROMPT_LENS = [5, 37, 64, 65, 130]   # across the DeltaNet chunk size 64
N_STEPS = 32                         # greedy steps per case
N_FORCED = 8                         # forced positions kept (full vocab)
LOGIT_STD = 2.0                      # lm_head std * sqrt(H): logits ~ N(0, 2^2) for a unit-RMS input
ROUTER_STD = 2.0                     # router logits ~ N(0, 2^2)
CACHED_TOL = 1e-2                    # cached decode vs uncached pass (float32; a position bug is O(1))
FAST_PACKAGES = ["fla", "flash_linear_attention", "causal_conv1d", "kernels"]
COUNTED = ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
           "causal_conv1d_update", "eager_attention_forward"]


def keep_fast_kernels_out():
    """Makes the optional fast-kernel packages unimportable so the pure-torch paths run."""
    kept = []
    for name in FAST_PACKAGES:
        if importlib.util.find_spec(name) is not None:
            sys.modules[name] = None
            kept.append(name)
    return kept


def layer_types_of(p):
    k = p["full_attention_interval"]
    return ["full_attention" if (i + 1) % k == 0 else "linear_attention" for i in range(p["num_hidden_layers"])]


def rope_of(p):
    return {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": list(p["mrope_section"]), "mrope_interleaved": True}


def build_hf(p):
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    kw = {k: p[k] for k in mf.TEXT_CONFIG_KEYS}
    cfg = Qwen3_5MoeTextConfig(**kw, hidden_act="silu", max_position_embeddings=262144, rms_norm_eps=1e-6,
                               tie_word_embeddings=False, attention_bias=False, layer_types=layer_types_of(p),
                               rope_parameters=rope_of(p))
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    model = Qwen3_5MoeForCausalLM(cfg).float().eval()
    for setter, value in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        try:
            getattr(model, setter)(value)
        except Exception as e:  # older transformers: set the config field directly
            print(f"{setter}: {type(e).__name__}: {e}", flush=True)
            try:
                setattr(model.config, "_" + setter[len("set_"):], value)
            except Exception:
                pass
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "lm_head is tied"
    return model


def mlx_prefix(hf_name):
    if hf_name.startswith("model."):
        return "language_model.model." + hf_name[len("model."):]
    assert hf_name.startswith("lm_head."), hf_name
    return "language_model." + hf_name


SHIFTED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                 "k_norm.weight")


def convert(model, p, seed, writer):
    """Draws every HF parameter, makes it exactly representable in the MLX checkpoint, sets it in the
    HF model and adds the MLX tensors to writer. -> links [(kind, mlx name, hf name, rows, bits)]."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    H = p["hidden_size"]
    I = p["moe_intermediate_size"]
    links = []

    def randn(shape, std, mean=0.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std + mean

    def add_q(module, w, bits, hf, rows=None):
        q, s, b, deq = mf.quantize(w, bits)
        if rows is None:
            parts = [(module, slice(None))]
        else:
            parts = rows
        for mod, sl in parts:
            writer.add_u32(mod + ".weight", mf.pack(q[..., sl, :].contiguous(), bits))
            writer.add_bf16(mod + ".scales", s[..., sl, :])
            writer.add_bf16(mod + ".biases", b[..., sl, :])
            links.append(("q", mod, hf, (sl.start, sl.stop), bits))
        return deq

    params = dict(model.named_parameters())
    for name in sorted(params):
        prm = params[name]
        shape = tuple(prm.shape)
        pre = mlx_prefix(name)
        if name.endswith("mlp.experts.gate_up_proj"):        # [E, 2I, H] -> gate rows, then up rows
            base = pre[: -len("experts.gate_up_proj")] + "switch_mlp."
            hf = add_q(None, randn(shape, 1 / math.sqrt(H)), 4, name,
                       rows=[(base + "gate_proj", slice(0, I)), (base + "up_proj", slice(I, 2 * I))])
        elif name.endswith("mlp.experts.down_proj"):         # [E, H, I]
            base = pre[: -len("experts.down_proj")] + "switch_mlp.down_proj"
            hf = add_q(base, randn(shape, 1 / math.sqrt(I)), 4, name)
        elif name.endswith("conv1d.weight"):                 # HF [C, 1, K] -> MLX [C, K, 1]
            hf = mf.bf16_round(randn(shape, 0.5))
            writer.add_bf16(pre, hf.permute(0, 2, 1).contiguous())
            links.append(("conv", pre, name, None, 0))
        elif name.endswith("A_log"):
            u = torch.rand(*shape, generator=gen, dtype=torch.float32) * 0.95 + 0.05
            hf = torch.log(u)
            writer.add_f32(pre, hf)
            links.append(("plain", pre, name, None, 0))
        elif name.endswith("dt_bias"):
            hf = mf.bf16_round(randn(shape, 0.3, 1.0))
            writer.add_bf16(pre, hf)
            links.append(("plain", pre, name, None, 0))
        elif name.endswith("linear_attn.norm.weight"):       # gated norm: plain gain
            hf = mf.bf16_round(randn(shape, 0.1, 1.0))
            writer.add_bf16(pre, hf)
            links.append(("plain", pre, name, None, 0))
        elif name.endswith(SHIFTED_NORMS) or name == "model.norm.weight":   # stored as 1 + w
            g = mf.bf16_round(randn(shape, 0.1, 1.0))
            hf = g - 1.0
            writer.add_bf16(pre, g)
            links.append(("plus1", pre, name, None, 0))
        elif len(shape) == 2 and name.endswith(".weight"):
            module = pre[: -len(".weight")]
            if "embed_tokens" in name:
                std = 1.0
            elif name.startswith("lm_head"):
                std = LOGIT_STD / math.sqrt(H)
            elif name.endswith("mlp.gate.weight"):
                std = ROUTER_STD / math.sqrt(H)
            else:
                std = 1 / math.sqrt(shape[1])
            hf = add_q(module, randn(shape, std), mf.bits_for(module), name)
        else:
            raise SystemExit(f"unknown HF parameter {name} {shape}")
        assert tuple(hf.shape) == shape, (name, hf.shape, shape)
        with torch.no_grad():
            prm.data.copy_(hf)
    return links


def read_back(path):
    """model.safetensors -> {name: torch tensor}; through the safetensors library when it can."""
    import numpy as np
    import torch
    try:
        from safetensors import safe_open
        out = {}
        with safe_open(path, framework="pt") as f:
            for k in f.keys():
                out[k] = f.get_tensor(k)
        return out, "safetensors.safe_open(pt)"
    except Exception as e:  # older safetensors without U32 for torch: parse here
        header, start = mf.read_safetensors_header(path)
        raw = open(path, "rb").read()
        out = {}
        for k, v in header.items():
            a, b = v["data_offsets"]
            buf = raw[start + a: start + b]
            if v["dtype"] == "U32":
                t = torch.from_numpy(np.frombuffer(buf, dtype="<u4").astype(np.int64))
            elif v["dtype"] == "BF16":
                t = torch.from_numpy(np.frombuffer(buf, dtype="<i2").copy()).view(torch.bfloat16)
            else:
                t = torch.from_numpy(np.frombuffer(buf, dtype="<f4").copy())
            out[k] = t.reshape(v["shape"])
        return out, f"own parser ({type(e).__name__}: {e})"


def as_i64(t):
    """U32 words as read (torch.uint32 or int64) -> int64 tensor."""
    import numpy as np
    import torch
    if t.dtype == torch.int64:
        return t
    try:
        return t.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    except Exception:
        return torch.from_numpy(t.numpy().astype(np.int64))


def check_readback(model, links, path):
    """Dequantizes every tensor read back from the file and compares with the HF parameters."""
    import torch
    tensors, how = read_back(path)
    params = dict(model.named_parameters())
    worst, used = 0.0, set()
    for kind, mod, hf, rows, bits in links:
        ref = params[hf].detach()
        if kind == "q":
            words = as_i64(tensors[mod + ".weight"])
            s = tensors[mod + ".scales"].float()
            b = tensors[mod + ".biases"].float()
            k = words.shape[-1] * 32 // bits
            q = mf.unpack(words, bits, k).float()
            deq = (s.repeat_interleave(mf.GROUP, dim=-1) * q + b.repeat_interleave(mf.GROUP, dim=-1))
            if rows != (None, None):
                ref = ref[..., rows[0]:rows[1], :]
            got = deq
            used |= {mod + ".weight", mod + ".scales", mod + ".biases"}
        else:
            got = tensors[mod].float()
            if kind == "conv":
                got = got.permute(0, 2, 1)
            elif kind == "plus1":
                got = got - 1.0
            used.add(mod)
        worst = max(worst, float((got - ref).abs().max()))
    missing = sorted(set(tensors) - used)
    assert not missing, f"file tensors not linked to HF: {missing[:5]}"
    return worst, how, tensors


def dequant(tensors, mod, bits):
    words = as_i64(tensors[mod + ".weight"])
    k = words.shape[-1] * 32 // bits
    q = mf.unpack(words, bits, k).double()
    s = tensors[mod + ".scales"].double().repeat_interleave(mf.GROUP, dim=-1)
    b = tensors[mod + ".biases"].double().repeat_interleave(mf.GROUP, dim=-1)
    return s * q + b


def check_moe(model, tensors, p, seed):
    """Layer 0 MoE block of HF vs the same block computed in float64 from the MLX tensors
    (router softmax, top-k, renormalize, switch_mlp experts, sigmoid-gated shared expert)."""
    import torch
    import torch.nn.functional as F
    P = "language_model.model.layers.0.mlp."
    x = torch.randn(7, p["hidden_size"], generator=torch.Generator().manual_seed(seed + 1))
    hf = model.model.layers[0].mlp(x[None])
    hf = (hf[0] if isinstance(hf, tuple) else hf)[0].double()
    xd = x.double()
    probs = torch.softmax(xd @ dequant(tensors, P + "gate", 8).T, dim=-1)
    top_p, top_i = torch.topk(probs, p["num_experts_per_tok"], dim=-1)
    top_p = top_p / top_p.sum(-1, keepdim=True)
    wg = dequant(tensors, P + "switch_mlp.gate_proj", 4)
    wu = dequant(tensors, P + "switch_mlp.up_proj", 4)
    wd = dequant(tensors, P + "switch_mlp.down_proj", 4)
    out = torch.zeros_like(xd)
    for t in range(x.shape[0]):
        for j in range(top_i.shape[1]):
            e = int(top_i[t, j])
            h = F.silu(wg[e] @ xd[t]) * (wu[e] @ xd[t])
            out[t] += top_p[t, j] * (wd[e] @ h)
    sh = dequant(tensors, P + "shared_expert.down_proj", 4) @ (
        F.silu(xd @ dequant(tensors, P + "shared_expert.gate_proj", 4).T)
        * (xd @ dequant(tensors, P + "shared_expert.up_proj", 4).T)).T
    sig = torch.sigmoid(xd @ dequant(tensors, P + "shared_expert_gate", 8).T)
    out += sig * sh.T
    return float((out - hf).abs().max())


def pick(logits):
    """float32 [V] -> ids sorted by logit descending, ties to the lower id."""
    import torch
    return torch.sort(-logits, stable=True).indices


def greedy(model, prompt, n, explicit_positions=False):
    """Prefill then cached single-token decode with transformers; -> (ids, [logits row f32 per step]).
    explicit_positions passes position_ids instead of letting the model derive them from its cache."""
    import torch

    def pos(a, b):
        return {"position_ids": torch.arange(a, b)[None]} if explicit_positions else {}
    out = model(input_ids=torch.tensor([prompt]), use_cache=True, **pos(0, len(prompt)))
    rows, ids = [out.logits[0, -1].float().clone()], []
    for s in range(n):
        ids.append(int(pick(rows[-1])[0]))
        if s == n - 1:
            break
        t = len(prompt) + s
        out = model(input_ids=torch.tensor([[ids[-1]]]), past_key_values=out.past_key_values, use_cache=True,
                    **pos(t, t + 1))
        rows.append(out.logits[0, -1].float().clone())
    return ids, rows


def step_record(row):
    import torch
    order = pick(row)
    lp = torch.log_softmax(row.double(), dim=-1)
    return {"id": int(order[0]), "logprob": round(float(lp[order[0]]), 7),
            "margin": round(float(row[order[0]] - row[order[1]]), 7),
            "top8": [[int(i), round(float(lp[i]), 7)] for i in order[:8]]}


def generate_check(model, prompt, ids, rows):
    """HF generate (greedy, raw logits) on one case vs the hand-written loop."""
    import torch
    try:
        x = torch.tensor([prompt])
        g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                           max_new_tokens=len(ids), output_logits=True, return_dict_in_generate=True,
                           eos_token_id=None, pad_token_id=0)
        gids = g.sequences[0, len(prompt):].tolist()
        diff = max(float((a[0].float() - b).abs().max()) for a, b in zip(g.logits, rows))
        return {"ids_equal": gids == ids, "max_abs_logit_diff": diff}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def run(args):
    kept = keep_fast_kernels_out()
    import numpy as np
    import torch
    import transformers
    import transformers.models.qwen3_5_moe.modeling_qwen3_5_moe as M
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_grad_enabled(False)
    calls, impl_names = {}, {}
    for n in COUNTED:
        f = getattr(M, n, None)
        if f is None:
            continue
        impl_names[n] = f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"

        def wrap(f=f, n=n):
            def counted(*a, **k):
                calls[n] = calls.get(n, 0) + 1
                return f(*a, **k)
            return counted
        setattr(M, n, wrap())

    p = PRESETS[args.preset]
    os.makedirs(args.out, exist_ok=True)
    model = build_hf(p)
    writer = mf.SafetensorsWriter()
    links = convert(model, p, args.seed, writer)
    st_path = os.path.join(args.out, "model.safetensors")
    writer.write(st_path)
    readback_err, readback_how, tensors = check_readback(model, links, st_path)
    moe_err = check_moe(model, tensors, p, args.seed)
    inv_freq = model.model.rotary_emb.inv_freq
    assert inv_freq.numel() * 2 == int(p["head_dim"] * 0.25), "rotary dim"
    print(f"[{args.preset}] readback max err {readback_err} ({readback_how}); moe check {moe_err:.3g}", flush=True)

    V = p["vocab_size"]
    cases, used = [], set()
    for ci, plen in enumerate(PROMPT_LENS):
        g = torch.Generator().manual_seed(args.seed * 1000 + ci)
        prompt = torch.randint(0, V, (plen,), generator=g).tolist()
        for explicit in (False, True):   # the second only if the cache-derived positions disagree
            ids, rows = greedy(model, prompt, N_STEPS, explicit)
            forced_ids = prompt + ids
            forced = model(input_ids=torch.tensor([forced_ids]), use_cache=False).logits[0].float()
            diffs = [float((rows[s] - forced[plen - 1 + s]).abs().max()) for s in range(N_STEPS)]
            agree = sum(int(pick(forced[plen - 1 + s])[0]) == ids[s] for s in range(N_STEPS))
            if max(diffs) <= CACHED_TOL:
                break
            print(f"[{args.preset}] case {ci}: cached vs forced {max(diffs):.3g} with explicit_positions="
                  f"{explicit}", flush=True)
        T = len(forced_ids)
        positions = list(range(T - N_FORCED, T))
        case = {"name": f"case{ci}_len{plen}", "prompt_len": plen, "prompt_ids": prompt, "generated_ids": ids,
                "steps": [step_record(r) for r in rows], "forced_ids": forced_ids,
                "forced_last_positions": positions,
                "forced_last_logits": [[round(v, 5) for v in forced[q].tolist()] for q in positions],
                "cached_vs_forced_max_abs_logit_diff": max(diffs), "cached_vs_forced_argmax_agree": agree,
                "decode_position_ids": "explicit" if explicit else "derived by transformers from its cache"}
        if ci in (0, len(PROMPT_LENS) - 1):
            case["hf_generate_check"] = generate_check(model, prompt, ids, rows)
        cases.append(case)
        used |= set(forced_ids)
        m = [s["margin"] for s in case["steps"]]
        print(f"[{args.preset}] {case['name']}: ids {ids}\n   top1 logprob mean "
              f"{np.mean([s['logprob'] for s in case['steps']]):.3f}, margins min {min(m):.4f} "
              f"(<=0.02: {sum(x <= 0.02 for x in m)}), distinct {len(set(ids))}, cached vs forced "
              f"{max(diffs):.3g} agree {agree}/{N_STEPS}, generate {case.get('hf_generate_check')}", flush=True)
        if max(diffs) > CACHED_TOL:
            raise SystemExit(f"cached decode disagrees with the uncached pass in {case['name']}")

    free = [i for i in range(V - 1, -1, -1) if i not in used]
    eos = free[:2]
    cfg_json = mf.mlx_config(p, layer_types_of(p), rope_of(p), eos)
    cfg_path = os.path.join(args.out, "config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg_json, f, indent=2)
    problems = golden_layout.check_dir(args.out)
    assert not problems, problems

    worst = min(((s["margin"], c["name"], i) for c in cases for i, s in enumerate(c["steps"])))
    summary = dict(cfg_json["text_config"])
    summary["eos_token_id"] = eos
    summary["rotary_dim"] = int(p["head_dim"] * 0.25)
    summary["hf_parameters"] = sum(x.numel() for x in model.parameters())
    impl = {"_attn_implementation": model.config._attn_implementation,
            "_experts_implementation": getattr(model.config, "_experts_implementation", None)}
    for n, full in impl_names.items():
        impl[n] = f"{full} (calls: {calls.get(n, 0)})"
    ex = {
        "format": "qwen3_5_moe-oracle/1", "generator": "tools/make_golden.py", "seed": args.seed,
        "preset": args.preset,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__,
                     "safetensors": _version("safetensors")},
        "device": "cpu", "dtype": "float32", "hf_class": type(model).__name__,
        "hf_implementations": impl, "fast_kernel_packages_kept_out": kept,
        "self_checks": {
            "readback_dequant_vs_hf_max_abs": readback_err, "readback_reader": readback_how,
            "moe_block_vs_float64_from_mlx_tensors_max_abs": moe_err,
            "cached_vs_forced_max_abs_logit_diff": max(c["cached_vs_forced_max_abs_logit_diff"] for c in cases),
            "tensor_inventory_vs_spec_problems": problems,
        },
        "config_summary": summary,
        "checkpoint": {"sha256": {"model.safetensors": mf.sha256(st_path), "config.json": mf.sha256(cfg_path)},
                       "weights": "w = float32(scale) * q + float32(bias) in float32; every non-quantized value "
                                  "is a bf16 value (A_log stored as F32); HF computed in float32 with exactly these"},
        "notes": {
            "generation": f"hand-written greedy loop over transformers forward (prefill, then one token at a "
                          f"time with its cache), {N_STEPS} steps, no stop token; HF generate cross-checked on "
                          f"the first and last case (hf_generate_check)",
            "eos": f"chosen after generation as the two highest ids that occur in no prompt and no generated "
                   f"token, so {eos} occur in no case",
            "logprob": "log_softmax of the raw float32 logits, computed in float64",
            "margin": "top-1 minus top-2 logit; a small margin means a fragile greedy pick",
            "forced_last_logits": f"one uncached pass over forced_ids; full-vocab logits of the last {N_FORCED} "
                                  f"positions (forced_last_positions), rounded to 5 decimals",
        },
        "summary": {"min_margin": worst[0], "min_margin_at": [worst[1], worst[2]]},
        "cases": cases,
    }
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(ex, f, separators=(",", ":"))
    golden_layout.render_readme(args.out)
    print(f"[{args.preset}] wrote {args.out}: " + ", ".join(
        f"{n} {os.path.getsize(os.path.join(args.out, n))}" for n in sorted(os.listdir(args.out))), flush=True)


# --- The precision envelope (../shared/docs/precision.md) ------------------------------------------
# transformers' own half-precision runs of a golden's model, scored with the metrics the golden test
# applies to lily: every step teacher-forced with the golden ids (prefill, then one token at a time
# with the cache), Δ = |logprob − golden logprob| at the golden (fp32) chosen id, top-1 agreement on
# steps whose golden margin is >= ENVELOPE_MARGIN, and the forced logits' max / RMS error.
ENVELOPE_MARGIN = 0.05


def score_run(model, ex, device):
    """Teacher-forced run of every case of expected.json -> envelope metrics (float64 on the host)."""
    import torch
    deltas, agree, compared, forced_max, forced_sq, forced_n = [], 0, 0, 0.0, 0.0, 0
    for c in ex["cases"]:
        prompt, steps = c["prompt_ids"], c["steps"]
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
        row = out.logits[0, -1].double().cpu()
        for s, g in enumerate(steps):
            lp = torch.log_softmax(row, dim=-1)
            deltas.append(abs(float(lp[g["id"]]) - g["logprob"]))
            if g["margin"] >= ENVELOPE_MARGIN:
                compared += 1
                agree += int(int(pick(row.float())[0]) == g["id"])
            if s + 1 < len(steps):
                out = model(input_ids=torch.tensor([[g["id"]]], device=device),
                            past_key_values=out.past_key_values, use_cache=True)
                row = out.logits[0, -1].double().cpu()
        logits = model(input_ids=torch.tensor([c["forced_ids"]], device=device), use_cache=False).logits[0]
        for q, ref in zip(c["forced_last_positions"], c["forced_last_logits"]):
            d = (logits[q].double().cpu() - torch.tensor(ref, dtype=torch.float64)).abs()
            forced_max = max(forced_max, float(d.max()))
            forced_sq += float((d * d).sum())
            forced_n += d.numel()
    deltas.sort()
    n = len(deltas)
    median = deltas[n // 2] if n % 2 else 0.5 * (deltas[n // 2 - 1] + deltas[n // 2])
    return {"steps": n, "top1_compared": compared, "top1_agree": agree, "max_delta": deltas[-1],
            "median_delta": median, "forced_max": forced_max, "forced_rms": math.sqrt(forced_sq / max(forced_n, 1))}


def envelope(args):
    """Rebuilds DIR's model from its preset and seed (the checkpoint must come out byte-identical), then
    scores transformers' fp32 (sanity: ~0), fp16 and bf16 runs of it on the GPU when there is one."""
    import copy
    import tempfile
    kept = keep_fast_kernels_out()
    import torch
    import transformers
    d = args.envelope
    with open(os.path.join(d, "expected.json")) as f:
        ex = json.load(f)
    p, seed = PRESETS[ex["preset"]], ex["seed"]
    torch.manual_seed(seed)
    torch.set_grad_enabled(False)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = build_hf(p)
    writer = mf.SafetensorsWriter()
    convert(model, p, seed, writer)
    with tempfile.TemporaryDirectory() as tmp:
        st = os.path.join(tmp, "model.safetensors")
        writer.write(st)
        sha = mf.sha256(st)
    want = ex["checkpoint"]["sha256"]["model.safetensors"]
    if sha != want:
        raise SystemExit(f"{d}: rebuilt checkpoint sha256 {sha} != recorded {want} (different torch RNG?)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    keep32 = list(getattr(type(model), "_keep_in_fp32_modules", None) or []) + \
        list(getattr(type(model), "_keep_in_fp32_modules_strict", None) or [])
    runs = {}
    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        m = copy.deepcopy(model).to(device=device, dtype=dtype)
        for pname, prm in m.named_parameters():   # what from_pretrained(dtype=...) keeps in fp32
            if any(k in pname for k in keep32):
                prm.data = prm.data.float()
        runs[name] = score_run(m, ex, device)
        print(f"[envelope] {os.path.basename(os.path.normpath(d))} {name}: {runs[name]}", flush=True)
        del m
    env = {"format": "lily-precision-envelope/1", "generator": "tools/make_golden.py --envelope",
           "golden_sha256": want, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": transformers.__version__},
           "fast_kernel_packages_kept_out": kept, "kept_in_fp32": keep32,
           "method": f"model.to(dtype) on {device}; every step teacher-forced with the golden ids (prefill, "
                     f"then cached one-token steps); delta = |logprob - golden logprob| at the golden id; "
                     f"top-1 agreement on steps with golden margin >= {ENVELOPE_MARGIN}; forced logits vs "
                     f"expected.json's forced_last_logits",
           "margin_threshold": ENVELOPE_MARGIN, "runs": runs}
    with open(os.path.join(d, "envelope.json"), "w") as f:
        json.dump(env, f, indent=1)
    print(f"[envelope] wrote {os.path.join(d, 'envelope.json')}", flush=True)


def _version(mod):
    try:
        return __import__(mod).__version__
    except Exception:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int)
    ap.add_argument("--out")
    ap.add_argument("--readme", metavar="DIR")
    ap.add_argument("--check", metavar="DIR")
    ap.add_argument("--envelope", metavar="DIR")
    args = ap.parse_args()
    if args.envelope:
        envelope(args)
    elif args.readme:
        golden_layout.render_readme(args.readme)
    elif args.check:
        problems = golden_layout.check_dir(args.check)
        print("\n".join(problems) or "ok")
        sys.exit(1 if problems else 0)
    else:
        if not (args.preset and args.seed is not None and args.out):
            ap.error("--preset, --seed and --out are required")
        run(args)


if __name__ == "__main__":
    main()
