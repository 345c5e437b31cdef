#!/usr/bin/env python3
"""The GPU's two ceilings, measured (docs/PERF.md compares llmi's figures with them):
device-memory bandwidth from a large device-to-device copy (bytes read + written), and
the bf16 matrix rate from an 8192^3 product on random data.  Needs torch with CUDA;
prints one line per figure:
    bandwidth_gbs 3012.4
    bf16_tflops 781.2
and exits 3 (after saying why) when torch or a GPU is missing.  gpu-check.sh runs it.
"""
import sys


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    try:
        import torch
    except ImportError:
        print("gpu-peaks: torch not installed")
        return 3
    if not torch.cuda.is_available():
        print("gpu-peaks: torch sees no CUDA device")
        return 3
    dev = torch.device("cuda")
    n = 1 << 30   # 2 GiB of bf16 each way
    src = torch.randn(n, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    times = []
    for i in range(12):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        torch.cuda.synchronize()
        if i >= 2:
            times.append(a.elapsed_time(b) / 1e3)
    print(f"bandwidth_gbs {2 * src.numel() * 2 / median(times) / 1e9:.1f}")
    del src, dst
    m = 8192
    x = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=dev, dtype=torch.bfloat16)
    times = []
    for i in range(13):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.matmul(x, y)
        b.record()
        torch.cuda.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b) / 1e3)
    print(f"bf16_tflops {2 * m ** 3 / median(times) / 1e12:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
