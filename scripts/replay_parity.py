#!/usr/bin/env python3
"""Holds vector-quantize-pytorch's quantizers against `vqddp replay`.

For each case below (a class and its keyword arguments) it builds the
reference module in training mode, writes its state_dict, the keywords and
a few batches with upstream gradients to a safetensors file, runs
`vqddp replay IN OUT --world W`, then steps the reference on the same
batches and prints, per step, the largest differences of the quantized
output, the loss, the input gradient, every parameter gradient and every
state tensor, and the number of rows whose indices differ. The last line
per case says PASS when every difference is within --tol and no index
differs.

Needs PyTorch, safetensors and vector_quantize_pytorch (with einx) on
PYTHONPATH; nothing in CI runs it (no PyTorch there). Only deterministic
settings are replayed: k-means init, dead-code revival, dropout, stochastic
sampling and FSP's perturbation draw from the reference's own generator.

usage: replay_parity.py VQDDP_EXE [--world W] [--tol T] [--only NAME] [--dir D]
"""
import argparse
import json
import os
import subprocess
import sys
import traceback

import torch
from safetensors.torch import load_file, save_file

import vector_quantize_pytorch as vqp

D, N, STEPS = 32, 96, 3

# name -> (class, keyword arguments); dim is always given, so the input width is known.
CASES = {
    "vq": ("VectorQuantize", dict(dim=D, codebook_size=64, decay=0.9)),
    "vq_no_rotation": ("VectorQuantize", dict(dim=D, codebook_size=64, decay=0.9, rotation_trick=False)),
    "vq_codebook_dim": ("VectorQuantize", dict(dim=D, codebook_size=64, codebook_dim=16)),
    "vq_layernorm_project_in": ("VectorQuantize", dict(dim=D, codebook_size=64, codebook_dim=16,
                                                       layernorm_after_project_in=True)),
    "vq_cosine": ("VectorQuantize", dict(dim=D, codebook_size=64, use_cosine_sim=True)),
    "vq_heads_shared": ("VectorQuantize", dict(dim=D, codebook_size=64, heads=2)),
    "vq_heads_separate": ("VectorQuantize", dict(dim=D, codebook_size=64, heads=2,
                                                 separate_codebook_per_head=True)),
    "vq_commit_weight": ("VectorQuantize", dict(dim=D, codebook_size=64, commitment_weight=0.5)),
    "vq_diversity": ("VectorQuantize", dict(dim=D, codebook_size=64, codebook_diversity_loss_weight=0.5)),
    "vq_commit_ce": ("VectorQuantize", dict(dim=D, codebook_size=64, commitment_use_cross_entropy_loss=True)),
    "vq_commit_ce_ema_off": ("VectorQuantize", dict(dim=D, codebook_size=64, commitment_use_cross_entropy_loss=True,
                                                    ema_update=False)),
    "vq_affine": ("VectorQuantize", dict(dim=D, codebook_size=64, affine_param=True)),
    "vq_ema_off": ("VectorQuantize", dict(dim=D, codebook_size=64, ema_update=False)),
    "rvq": ("ResidualVQ", dict(dim=D, codebook_size=64, num_quantizers=4, decay=0.9)),
    "rvq_shared": ("ResidualVQ", dict(dim=D, codebook_size=64, num_quantizers=3, shared_codebook=True)),
    "rvq_cosine": ("ResidualVQ", dict(dim=D, codebook_size=64, num_quantizers=3, use_cosine_sim=True)),
    "rvq_beam": ("ResidualVQ", dict(dim=D, codebook_size=64, num_quantizers=3, beam_size=2)),
    "rvq_beam_shared": ("ResidualVQ", dict(dim=D, codebook_size=64, num_quantizers=3, beam_size=3,
                                          shared_codebook=True, beam_score_quantizer_weights=[1.0, 0.5, 0.25])),
    "rvq_codebook_dim": ("ResidualVQ", dict(dim=D, codebook_size=64, num_quantizers=3, codebook_dim=16)),
    "grouped_rvq": ("GroupedResidualVQ", dict(dim=D, codebook_size=64, num_quantizers=2, groups=2)),
    "fsq": ("FSQ", dict(dim=4, levels=[8, 5, 5, 5])),
    "fsq_project": ("FSQ", dict(dim=D, levels=[8, 5, 5, 5])),
    "fsq_codebooks": ("FSQ", dict(dim=D, levels=[8, 5, 5, 5], num_codebooks=2)),
    "fsq_symmetric": ("FSQ", dict(dim=4, levels=[8, 5, 5, 5], preserve_symmetry=True)),
    "fsq_symmetric_hard": ("FSQ", dict(dim=D, levels=[8, 5, 2, 5], preserve_symmetry=True, bound_hard_clamp=True)),
    "fsq_hard_clamp": ("FSQ", dict(dim=4, levels=[8, 5, 5, 5], bound_hard_clamp=True)),
    "residual_fsq": ("ResidualFSQ", dict(dim=D, levels=[8, 5, 5, 5], num_quantizers=3)),
    "grouped_residual_fsq": ("GroupedResidualFSQ", dict(dim=D, levels=[8, 5, 5, 5], num_quantizers=2, groups=2)),
    "lfq": ("LFQ", dict(dim=8, codebook_size=256)),
    "lfq_project": ("LFQ", dict(dim=D, codebook_size=256, entropy_loss_weight=0.1, diversity_gamma=1.0)),
    "lfq_commitment": ("LFQ", dict(dim=D, codebook_size=256, commitment_loss_weight=0.25)),
    "residual_lfq": ("ResidualLFQ", dict(dim=D, codebook_size=256, num_quantizers=3)),
    "grouped_residual_lfq": ("GroupedResidualLFQ", dict(dim=D, codebook_size=256, num_quantizers=2, groups=2)),
    "sim_vq": ("SimVQ", dict(dim=D, codebook_size=64)),
    "sim_vq_no_rotation": ("SimVQ", dict(dim=D, codebook_size=64, rotation_trick=False)),
    "residual_sim_vq": ("ResidualSimVQ", dict(dim=D, codebook_size=64, num_quantizers=3)),
    "fsp_no_perturbation": ("FSP", dict(dim=D, levels=[8, 5, 5, 5], quantize_rate=1.0)),
    "fsp_normal": ("FSP", dict(dim=D, levels=[8, 5, 5, 5], quantize_rate=1.0, act_name="normal")),
    "fsp_laplace_inv": ("FSP", dict(dim=D, levels=[8, 5, 5, 5], quantize_rate=1.0, act_name="laplace",
                                    need_inv_act=True)),
    "fsp_cauchy": ("FSP", dict(dim=D, levels=[8, 5, 5, 5], quantize_rate=1.0, act_name="cauchy")),
    "latent_quantize": ("LatentQuantize", dict(dim=D, levels=[5, 5, 5])),
    "random_projection": ("RandomProjectionQuantizer", dict(dim=D, codebook_size=64, codebook_dim=8)),
    "random_projection_codebooks": ("RandomProjectionQuantizer", dict(dim=D, codebook_size=64, codebook_dim=8,
                                                                      num_codebooks=2)),
}

# Where we differ from the reference on purpose (README's parity table says why).
KNOWN = {
    "vq_diversity": "the reference averages the code distribution per sequence position, not over the batch",
    "vq_commit_ce": "the reference's backward reads the codes its EMA update rewrote in place (vq_commit_ce_ema_off "
                    "holds the formula)",
    "rvq_beam": "the reference's beam path EMA-updates layer 0 only (residual_vq.py indexes all_residuals[..., 0, :] "
                "on its layer axis); vqddp updates every layer from the chosen path",
    "rvq_beam_shared": "the reference's beam path takes one shared-codebook EMA step from layer 0's rows only (the same "
                       "indexing); vqddp one step per layer",
}


def host(t):
    return t.detach().long() if t.dtype == torch.bool else t.detach().float().contiguous().clone()


def maxdiff(a, b):
    a, b = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    if a.numel() != b.numel():
        return float("inf")
    return (a - b).abs().max().item() if a.numel() else 0.0


def indices_of(cls, idx, n):
    if cls.startswith("Grouped"):  # [G, 1, N, Q] -> [N, G*Q], group-major
        idx = idx.permute(1, 2, 0, 3)
    return idx.reshape(n, -1)


def run_case(name, cls, kw, exe, world, tol, work):
    torch.manual_seed(0)
    ref = getattr(vqp, cls)(**kw).train()
    xs = [torch.randn(N, D if "dim" not in kw else kw["dim"]) for _ in range(STEPS)]
    gs = [torch.randn_like(x) for x in xs]
    tensors = {k: host(v) for k, v in ref.state_dict().items()}
    for i in range(STEPS):
        tensors[f"x.{i}"], tensors[f"g.{i}"] = xs[i].clone(), gs[i].clone()
    meta = {"class": cls} | {k: json.dumps(v) for k, v in kw.items()}
    fin, fout = os.path.join(work, f"{name}.in.safetensors"), os.path.join(work, f"{name}.out.safetensors")
    save_file(tensors, fin, metadata=meta)
    r = subprocess.run([exe, "replay", fin, fout, "--world", str(world)], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{name}: replay failed ({r.returncode}): {r.stderr.strip()[-600:]}")
        return "REFUSED"
    out = load_file(fout)
    worst, bad_rows, missing = 0.0, 0, set()
    for i in range(STEPS):
        for p in ref.parameters():
            p.grad = None
        x = xs[i].clone().requires_grad_()
        channel_first = cls == "LatentQuantize"  # it takes [b, d, n]
        ret = ref(x.t()[None] if channel_first else x[None])
        if isinstance(ret, torch.Tensor):  # RandomProjectionQuantizer: the indices (targets) alone
            idx, total, row = ret, torch.zeros(()), {}
        else:
            q, idx = (ret[0].transpose(1, 2) if channel_first else ret[0]), ret[1]
            losses = [t for t in ret[2:] if isinstance(t, torch.Tensor)]
            total = sum((l.sum() for l in losses), torch.zeros(()))
            ((q[0] * gs[i]).sum() + total).backward()
            row = {"quantized": maxdiff(q[0], out[f"quantized.{i}"])}
        ours_idx = out[f"indices.{i}"]
        theirs_idx = indices_of(cls, idx.detach(), N)
        if theirs_idx.shape == ours_idx.shape:
            rows = int((theirs_idx.long() != ours_idx.long()).any(dim=1).sum())
        else:
            rows = N
            print(f"  {name} step {i}: indices shape {tuple(theirs_idx.shape)} vs ours {tuple(ours_idx.shape)}")
        bad_rows += rows
        if f"loss.{i}" in out:
            row["loss"] = maxdiff(total, out[f"loss.{i}"])
        if x.grad is not None and f"grad.x.{i}" in out:
            row["grad.x"] = maxdiff(x.grad, out[f"grad.x.{i}"])
        for pn, p in ref.named_parameters():
            key = f"grad.{pn}.{i}"
            if p.grad is not None and key in out:
                row[f"grad.{pn}"] = maxdiff(p.grad, out[key])
            elif p.grad is not None and p.grad.abs().max() > 0:
                missing.add(key.rsplit(".", 1)[0])
        for k, v in ref.state_dict().items():
            if f"{k}.{i}" in out:
                row[k] = maxdiff(host(v), out[f"{k}.{i}"])
            else:
                missing.add(k)
        top = sorted(row.items(), key=lambda kv: -kv[1])[:3]
        print(f"  {name} step {i}: index rows differing {rows}/{N}; largest: "
              + ", ".join(f"{k} {v:.3g}" for k, v in top))
        worst = max([worst] + list(row.values()))
    if missing:
        print(f"  {name}: not in OUT: {sorted(missing)}")
    verdict = "PASS" if worst <= tol and bad_rows == 0 else ("KNOWN" if name in KNOWN else "DIFFERS")
    why = f"; known: {KNOWN[name]}" if verdict == "KNOWN" else ""
    print(f"{name}: {verdict} (largest difference {worst:.3g}, index rows differing {bad_rows}){why}")
    return verdict


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--only", default="")
    ap.add_argument("--dir", default="/tmp/replay_parity")
    a = ap.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, vector_quantize_pytorch from {os.path.dirname(vqp.__file__)}")
    tally = {}
    for name, (cls, kw) in CASES.items():
        if a.only and a.only not in name:
            continue
        try:
            v = run_case(name, cls, kw, a.exe, a.world, a.tol, a.dir)
        except Exception:
            print(f"{name}: ERROR in the reference or the harness\n{traceback.format_exc(limit=3)}")
            v = "ERROR"
        tally[v] = tally.get(v, 0) + 1
        sys.stdout.flush()
    print("replay parity:", ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))


if __name__ == "__main__":
    main()
