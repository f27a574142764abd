#!/usr/bin/env python3
"""cuBLAS bf16 at the prefill GEMMs' shapes, beside CudaPrefill.GemmBench (run.sh ops with OPS_BENCH=1 and
CUBLAS=1): the issue-21 yardstick "TFLOP/s of each op beside cuBLAS bf16 at the same shapes, same run".

Needs torch with CUDA (the GPU machine has it; nothing here installs it). Shapes as GemmBench: M = 4,096
tokens; dense y[M, N] = x[M, K] · w[K, N]; the MoE as one batched product over 256 experts of 128 rows each
(4,096 tokens × top-8 / 256 experts, uniform routing), gate and up as one [K, 2·I] matrix. Model TFLOP/s =
2·M·N·K per call (the MoE: 2·slots·N·K), mean of 20 calls after 3 warm-up calls, timed by CUDA events.
"""
import sys

try:
    import torch
except ImportError:
    print("cublas_bench: no torch here", file=sys.stderr)
    sys.exit(1)

if not torch.cuda.is_available():
    print("cublas_bench: torch sees no CUDA device", file=sys.stderr)
    sys.exit(1)

M, H, E, TOP, I, IS = 4096, 2048, 256, 8, 512, 512
DENSE = [
    ("gdn in_proj 12352x2048", 12352, 2048),
    ("out_proj/o_proj 2048x4096", 2048, 4096),
    ("attn qkv 9216x2048", 9216, 2048),
    ("shared gate+up 2x512x2048", 2 * IS, 2048),
    ("shared down 2048x512", 2048, 512),
]


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / reps  # ms


def row(name, ms, flop):
    print(f"| {name:<26} | {ms:8.3f} ms {flop / (ms * 1e-3) / 1e12:6.1f} TF/s |", flush=True)


def main():
    dev = torch.device("cuda")
    print(f"cuBLAS bf16 (torch {torch.__version__}, {torch.cuda.get_device_name(0)})")
    print("| GEMM (M=4096) | cuBLAS bf16 |")
    for name, n, k in DENSE:
        x = torch.randn(M, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        row(name, timed(lambda: x @ w), 2.0 * M * n * k)
    per = M * TOP // E  # rows an expert
    x = torch.randn(E, per, H, device=dev, dtype=torch.bfloat16)
    gu = torch.randn(E, H, 2 * I, device=dev, dtype=torch.bfloat16)
    row("moe gate+up 8x2x512x2048", timed(lambda: torch.bmm(x, gu)), 2.0 * E * per * 2 * I * H)
    a = torch.randn(E, per, I, device=dev, dtype=torch.bfloat16)
    dn = torch.randn(E, I, H, device=dev, dtype=torch.bfloat16)
    row("moe down 8x2048x512", timed(lambda: torch.bmm(a, dn)), 2.0 * E * per * H * I)


if __name__ == "__main__":
    main()
