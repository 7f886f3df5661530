#!/usr/bin/env python3
"""Plain PyTorch EMA codebook step, the baseline of bench/cuda_codebook_step.

The same work as vqddp's GPU step with revival and k-means off: distances
|x|^2-free (|e|^2 - 2 x.e), argmin, quantize = embed[index], per-code
counts and sums (index_add_, float atomics), EMA of sizes and sums, Laplace
smoothing, embed = avg / smoothed. Prints one line:
    torch train_ms=<median> eval_ms=<median>
Usage: torch_ema_step.py N D K [reps]
"""
import sys

import torch


def main():
    n, d, k = (int(a) for a in sys.argv[1:4])
    reps = int(sys.argv[4]) if len(sys.argv) > 4 else 10
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False  # full float32, like vqddp's default
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(n, d, device=dev, generator=g)
    embed = torch.randn(k, d, device=dev, generator=g)
    embed_avg = embed.clone()
    cluster_size = torch.ones(k, device=dev)
    decay, eps = 0.99, 1e-5

    def assign():
        scores = (embed * embed).sum(1) - 2 * x @ embed.t()
        return scores.argmin(1)

    def train_step():
        idx = assign()
        quantize = embed[idx]
        counts = torch.zeros(k, device=dev).index_add_(0, idx, torch.ones(n, device=dev))
        sums = torch.zeros(k, d, device=dev).index_add_(0, idx, x)
        cluster_size.mul_(decay).add_(counts, alpha=1 - decay)
        embed_avg.mul_(decay).add_(sums, alpha=1 - decay)
        total = cluster_size.sum()
        smoothed = (cluster_size + eps) / (total + k * eps) * total
        embed.copy_(embed_avg / smoothed.unsqueeze(1))
        return quantize

    def eval_step():
        return embed[assign()]

    def median_ms(f):
        times = []
        for _ in range(reps + 2):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            f()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        times = sorted(times[2:])  # two warm-up runs
        return times[len(times) // 2]

    with torch.no_grad():
        print(f"torch train_ms={median_ms(train_step):.3f} eval_ms={median_ms(eval_step):.3f}")


if __name__ == "__main__":
    main()
