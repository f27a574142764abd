"""MLX affine quantization and the MLX checkpoint layout (safetensors + config.json wrapper),
written from float tensors; used by make_golden.py. torch is imported only where tensors are made."""
import hashlib
import json
import struct

GROUP = 64


def bits_for(mlx_module):
    """mlx-lm's quant_predicate: the router and the shared-expert gate are 8-bit, the rest 4-bit."""
    return 8 if mlx_module.endswith("mlp.gate") or mlx_module.endswith("shared_expert_gate") else 4


def bf16_round(t):
    """float32 tensor -> float32 tensor holding the nearest bf16 values (round to nearest even)."""
    import torch
    return t.to(torch.float32).to(torch.bfloat16).to(torch.float32)


def quantize(w, bits, group=GROUP):
    """Affine quantization along the last (input) dim, per row and group of `group`.
    w: float32 [..., K]. scale = (max-min)/(2^bits-1), bias = min, both rounded to bf16;
    q = clamp(round((w-bias)/scale), 0, 2^bits-1).
    Returns (q int64 [..., K], scales f32 [..., K/group] (bf16 values), biases likewise,
             deq f32 [..., K] = float32(scale)*q + float32(bias))."""
    import torch
    shape = tuple(w.shape)
    k = shape[-1]
    assert k % group == 0, f"input dim {k} not divisible by {group}"
    g = w.to(torch.float32).reshape(*shape[:-1], k // group, group)
    lo = g.amin(dim=-1)
    hi = g.amax(dim=-1)
    levels = float(2 ** bits - 1)
    scale = bf16_round((hi - lo) / levels)
    bias = bf16_round(lo)
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    q = torch.round((g - bias[..., None]) / safe[..., None]).clamp_(0, levels)
    q = torch.where(scale[..., None] == 0, torch.zeros_like(q), q)
    # scale (8 significant bits) times q (<= 8 bits) is exact in fp32: one rounding, at the add.
    deq = scale[..., None] * q + bias[..., None]
    return (q.to(torch.int64).reshape(shape), scale, bias, deq.reshape(shape))


def pack(q, bits):
    """int64 codes [..., K] -> uint32 numpy words [..., K*bits/32]; element c sits in word c*bits/32
    at bit offset bits*(c mod 32/bits): the low bits hold the first element."""
    import numpy as np
    per = 32 // bits
    shape = tuple(q.shape)
    assert shape[-1] % per == 0
    c = q.reshape(*shape[:-1], shape[-1] // per, per)
    word = c[..., 0].clone()
    for j in range(1, per):
        word |= c[..., j] << (bits * j)
    return word.numpy().astype(np.uint32)


def unpack(words, bits, k):
    """Inverse of pack, from an int64 tensor of words [..., k*bits/32] to int64 codes [..., k]."""
    import torch
    per = 32 // bits
    mask = (1 << bits) - 1
    parts = [(words >> (bits * j)) & mask for j in range(per)]
    return torch.stack(parts, dim=-1).reshape(*words.shape[:-1], k)


class SafetensorsWriter:
    """Collects named tensors (BF16 from float tensors, F32, U32 from numpy) and writes one file:
    u64 header length, JSON header (names sorted, 8-byte padded), raw little-endian data."""

    def __init__(self):
        self.items = {}

    def add_bf16(self, name, t):
        import torch
        raw = t.to(torch.float32).to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
        self._add(name, "BF16", list(t.shape), raw)

    def add_f32(self, name, t):
        import torch
        self._add(name, "F32", list(t.shape), t.to(torch.float32).contiguous().numpy().tobytes())

    def add_u32(self, name, arr):
        import numpy as np
        self._add(name, "U32", list(arr.shape), np.ascontiguousarray(arr, dtype="<u4").tobytes())

    def _add(self, name, dtype, shape, raw):
        assert name not in self.items, name
        self.items[name] = (dtype, shape, raw)

    def write(self, path):
        header = {"__metadata__": {"format": "mlx"}}
        off = 0
        for name in sorted(self.items):
            dtype, shape, raw = self.items[name]
            header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
            off += len(raw)
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * ((8 - len(hb) % 8) % 8)
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for name in sorted(self.items):
                f.write(self.items[name][2])


def read_safetensors_header(path):
    """-> (header dict without __metadata__, data start offset). Pure Python."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


TEXT_CONFIG_KEYS = [
    "hidden_size", "num_hidden_layers", "vocab_size", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "num_attention_heads",
    "num_key_value_heads", "head_dim", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
]


def mlx_config(p, layer_types, rope_parameters, eos_ids):
    """The MLX wrapper config.json (as mlx-lm writes it for Qwen3.6-35B-A3B-4bit), as a dict.
    p: preset dict with the TEXT_CONFIG_KEYS and full_attention_interval."""
    text = {"model_type": "qwen3_5_moe_text"}
    for k in TEXT_CONFIG_KEYS:
        text[k] = p[k]
    text.update({
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "attn_output_gate": True,
        "norm_topk_prob": True,
        "full_attention_interval": p["full_attention_interval"],
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "layer_types": list(layer_types),
        "rope_parameters": dict(rope_parameters),
        "initializer_range": 0.02,
        "router_aux_loss_coef": 0.001,
        "use_cache": True,
        "dtype": "bfloat16",
        "eos_token_id": eos_ids[0],
    })
    quant = {"group_size": GROUP, "bits": 4, "mode": "affine"}
    for i in range(p["num_hidden_layers"]):
        for m in ("mlp.gate", "mlp.shared_expert_gate"):
            quant[f"language_model.model.layers.{i}.{m}"] = {"group_size": GROUP, "bits": 8}
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "eos_token_id": list(eos_ids),
        "text_config": text,
        "quantization": quant,
        "quantization_config": dict(quant),
    }
