#!/usr/bin/env python3
"""PyTorch twin of vqddp's main job (examples/speech_codec.json), for a speed comparison.

A benchmark: it prints steps/s and ratios, is never part of CI, and checks
nothing about vqddp's results. It needs PyTorch on the CPU; Debian's package
(torch 1.13) is enough:

    apt-get install python3-torch

Usage (from anywhere; the script finds the repository root from its own path):

    python3 bench/torch_codec_twin.py [--steps N] [--warmup W] [--threads T]
                                      [--vqddp PATH_TO_vqddp] [--wav DIR]
                                      [--device cpu|cuda] [--size main|10x]
                                      [--mode eager-fp32|eager-default|compile|all]

On a GPU (--device cuda) the twin runs in three modes (--mode all runs each
in turn, in one process): eager float32 with TF32 off (vqddp's arithmetic),
eager with PyTorch's defaults, and torch.compile(mode="reduce-overhead") of
the model (CUDA graphs where Inductor can take them; the optimizer steps
eagerly, as in most training loops). --size 10x is a codec about ten times
the main job's work (channels 32-128-256, batch 64, 8000-sample frames;
bench/speech_codec_10x.json for vqddp). With --vqddp the same binary trains
the same config on the same device (--device cuda: its cuda device) in the
same call, so the ratios compare one machine at one moment.

It trains the twin for W warm-up steps, then times N steps and prints
    torch twin: N steps in S s, X steps/s (torch VERSION, T threads, P parameters)
With --vqddp it then runs, in turn and on the same cores,
    vqddp train TWIN_JOB --steps N --dir TMP --overwrite
    (the main job without the two losses the twin lacks, below; the config's
    4 thread ranks) and the same with --world 1,
reads the steps/s of the last "step ..." line each prints, and prints
    vqddp (4 thread ranks, ...): Y steps/s; vqddp/torch eager-fp32 Z
(a ratio above 1: vqddp is faster), then the main job itself on both. With
--rounds R it does all of that R times in turn and prints each ratio's median
over the rounds, so a machine's drift touches both sides alike. vqddp's rate is measured from the start of
its training loop, so it includes its first (k-means) step and its logging;
the twin's excludes its warm-up steps. The twin feeds synthetic sine-mixture
frames of the real shapes ([16, 1, 1600]) from a fixed pool (or, with --wav
DIR, 1600-sample frames cut from 16-bit mono WAV files), so data loading costs
it next to nothing.

How the twin matches the C++ model (model.type conv_codec, channels
[8, 64, 128], strides [8, 5], residual_units 1, latent_dim 16, elu,
weight_norm true; 235,626 trainable parameters in both):
  * Every convolution is weight-normalised (weight_g per slice of the weight's
    first dimension, weight_v) with a bias: engine/nn_conv.h/.cpp
    (ConvLayer, weight_norm) == torch.nn.utils.weight_norm(dim=0), for
    ConvTranspose1d too (its weight is [in, out, k] in both, so g has `in`
    entries). Initial weights uniform +-1/sqrt(fan_in), fan_in =
    weight.shape[1] * k, as torch's defaults.
  * Residual unit (train/networks.cpp residual_units): x + Conv1d(k 1)(elu(
    Conv1d(k 3, dilation 1, padding 1)(elu(x)))), dilation 3^u for unit u.
  * Encoder (train/networks.cpp conv_codec_network):
      Conv1d(1, 8, k 7, p 3)
      ResUnit(8);   elu, Conv1d(8, 64, k 16, stride 8, p 4)      1600 -> 200
      ResUnit(64);  elu, Conv1d(64, 128, k 10, stride 5, p 3)     200 -> 40
      elu, Conv1d(128, 16, k 3, p 1)                              -> [N, 16, 40]
  * Tokens: [N, 16, 40] -> [N, 40, 16] -> [N * 40, 16] rows (train/model.cpp
    tokens_of), and back for the decoder (latent_of).
  * Decoder:
      Conv1d(16, 128, k 7, p 3)
      elu, ConvTranspose1d(128, 64, k 10, stride 5, p 3, output_padding 1)  40 -> 200
      ResUnit(64)
      elu, ConvTranspose1d(64, 8, k 16, stride 8, p 4, output_padding 0)    200 -> 1600
      ResUnit(8)
      elu, Conv1d(8, 1, k 7, p 3)
  * Quantizer (vq/residual_vq.cpp, vq/codebook.cpp, vq/kernels/
    cpu_vq_kernels.cpp): residual VQ of 2 EMA codebooks of 256 x 16 (buffers,
    not parameters), no projection (codebook_dim = dim). Per layer: k-means
    init on the first training step (10 iterations, initial means drawn from
    the batch's rows); nearest code by |e|^2 - 2 x.e (matmul) and argmin;
    code = embed[index] from before this step's update; counts and sums by
    index_add; EMA (decay 0.99) of cluster_size and embed_avg; Laplace
    smoothing with eps 1e-5; dead codes (cluster_size < 0.5) replaced by rows
    of the batch drawn without replacement, resetting embed, embed_avg (=
    row * threshold) and cluster_size (= threshold) together; loss
    0.25 * mse(code.detach(), residual); straight-through output
    residual + (code - residual).detach(); residual -= output.detach().
  * Loss: mse(reconstruction, x) + the 2 layers' commitment losses. The main
    job also weighs in a multi-resolution STFT loss and a STOI loss (0.01
    each), which the twin does not compute: vqddp trains the twin's job,
    the main job with model.spectral_weight and model.stoi_weight 0 (a
    config written next to its run), and then the main job itself, whose
    rate is printed beside (no ratio: the twin does less). AdamW(lr 0.002, betas (0.8, 0.99),
    eps 1e-8, weight_decay 0), gradients clipped to norm 1.0, cosine
    learning rate from lr to 0.1 lr over the run (train/schedule.cpp
    learning_rate), batch 16 (the global batch; vqddp splits it over its
    ranks).
Simplified: the twin runs one process (no data-parallel ranks, so no
all-reduce of the codebook statistics); it computes no per-step codebook
metrics (vqddp computes them only on logged steps); the revival's row draw is
torch.randperm rather than vqddp's shared-stream sampler. Works with torch
1.13 (no torch.compile).
"""
import argparse
import array
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import wave

import torch
import torch.nn as nn
import torch.nn.functional as F

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = "examples/speech_codec.json"
CPP_PARAMETERS = 235626  # vqddp's CodecModel for examples/speech_codec.json

# examples/speech_codec.json
CHANNELS = [8, 64, 128]
STRIDES = [8, 5]
RESIDUAL_UNITS = 1
LATENT_DIM = 16
FRAME = 1600
BATCH = 16
# --size: (channels, frame, batch, vqddp config, vqddp parameter count or None).
SIZES = {
    "main": ([8, 64, 128], 1600, 16, CONFIG, CPP_PARAMETERS),
    "10x": ([32, 128, 256], 8000, 64, "bench/speech_codec_10x.json", None),
}
DEVICE = torch.device("cpu")
NUM_QUANTIZERS = 2  # examples/speech_codec.json
CODEBOOK_SIZE = 256
DECAY = 0.99
EPS = 1e-5  # CodebookOptions.eps default (vq/codebook.h); the config does not set it
COMMITMENT_WEIGHT = 0.25
DEAD_CODE_THRESHOLD = 0.5
KMEANS_ITERS = 10
LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 0.002, (0.8, 0.99), 0.0, 1.0
FINAL_LR_FRACTION = 0.1  # OptimizerConfig default (train/config.h)


def wn(layer):
    return nn.utils.weight_norm(layer)  # dim 0, as engine/nn_conv.cpp


def conv(cin, cout, k, stride=1, padding=0, dilation=1):
    return wn(nn.Conv1d(cin, cout, k, stride=stride, padding=padding, dilation=dilation))


def conv_up(cin, cout, k, stride, padding, output_padding):
    return wn(nn.ConvTranspose1d(cin, cout, k, stride=stride, padding=padding, output_padding=output_padding))


def stride_padding(s):
    return (s + 1) // 2


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


def residual_units(ch):
    units, dilation = [], 1
    for _ in range(RESIDUAL_UNITS):
        units.append(Residual(nn.Sequential(nn.ELU(), conv(ch, ch, 3, padding=dilation, dilation=dilation),
                                            nn.ELU(), conv(ch, ch, 1))))
        dilation *= 3
    return units


def make_encoder():
    layers = [conv(1, CHANNELS[0], 7, padding=3)]
    for i, s in enumerate(STRIDES):
        layers += residual_units(CHANNELS[i])
        layers += [nn.ELU(), conv(CHANNELS[i], CHANNELS[i + 1], 2 * s, stride=s, padding=stride_padding(s))]
    layers += [nn.ELU(), conv(CHANNELS[-1], LATENT_DIM, 3, padding=1)]
    return nn.Sequential(*layers)


def make_decoder():
    layers = [conv(LATENT_DIM, CHANNELS[-1], 7, padding=3)]
    for i in reversed(range(len(STRIDES))):
        s = STRIDES[i]
        pad = stride_padding(s)
        layers += [nn.ELU(), conv_up(CHANNELS[i + 1], CHANNELS[i], 2 * s, s, pad, 2 * pad - s)]
        layers += residual_units(CHANNELS[i])
    layers += [nn.ELU(), conv(CHANNELS[0], 1, 7, padding=3)]
    return nn.Sequential(*layers)


def nearest(x, embed):
    # |x|^2 is the same for every code: argmin of |e|^2 - 2 x.e (vq/assign.h).
    scores = (embed * embed).sum(1) - 2 * (x @ embed.t())
    return scores.argmin(1)


def draw_rows(n, k, gen):
    """k row numbers of n: without replacement when n >= k."""
    if n >= k:
        return torch.randperm(n, generator=gen, device=gen.device)[:k]
    return torch.randint(n, (k,), generator=gen, device=gen.device)


class EmaCodebook(nn.Module):
    def __init__(self, k, d):
        super().__init__()
        self.k, self.d = k, d
        self.register_buffer("embed", torch.zeros(k, d))  # k-means init pending
        self.register_buffer("embed_avg", torch.zeros(k, d))
        self.register_buffer("cluster_size", torch.ones(k))
        self.initted = False

    def stats(self, x, idx):
        counts = torch.zeros(self.k, dtype=x.dtype, device=x.device).index_add_(
            0, idx, torch.ones(x.shape[0], dtype=x.dtype, device=x.device))
        sums = torch.zeros(self.k, self.d, dtype=x.dtype, device=x.device).index_add_(0, idx, x)
        return counts, sums

    def kmeans_init(self, x, gen):
        means = x[draw_rows(x.shape[0], self.k, gen)].clone()
        bins = None
        for _ in range(KMEANS_ITERS):
            counts, sums = self.stats(x, nearest(x, means))
            means = torch.where(counts.unsqueeze(1) > 0, sums / counts.clamp(min=1).unsqueeze(1), means)
            bins = counts
        self.embed.copy_(means)
        self.embed_avg.copy_(means * bins.unsqueeze(1))
        self.cluster_size.copy_(bins)
        self.initted = True

    def update(self, x, idx, gen):
        counts, sums = self.stats(x, idx)
        self.cluster_size.mul_(DECAY).add_(counts, alpha=1 - DECAY)
        self.embed_avg.mul_(DECAY).add_(sums, alpha=1 - DECAY)
        n = self.cluster_size.sum()
        smoothed = (self.cluster_size + EPS) / (n + self.k * EPS) * n
        self.embed.copy_(self.embed_avg / smoothed.unsqueeze(1))
        # Revival after the EMA, every step (no host branch on whether any
        # code expired, as vqddp): the j-th expired code takes the j-th drawn row.
        expired = self.cluster_size < DEAD_CODE_THRESHOLD
        rank = (torch.cumsum(expired.to(torch.int64), 0) - 1).clamp(min=0)
        rows = x[draw_rows(x.shape[0], self.k, gen)[rank]]
        mask = expired.unsqueeze(1)
        self.embed.copy_(torch.where(mask, rows, self.embed))
        self.embed_avg.copy_(torch.where(mask, rows * DEAD_CODE_THRESHOLD, self.embed_avg))
        self.cluster_size.masked_fill_(expired, DEAD_CODE_THRESHOLD)


class ResidualVQ(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(EmaCodebook(CODEBOOK_SIZE, LATENT_DIM) for _ in range(NUM_QUANTIZERS))
        self.gen = torch.Generator(device=DEVICE).manual_seed(0)

    def forward(self, z):
        residual = z
        total = torch.zeros_like(z)
        loss = torch.zeros((), device=z.device)
        indices = []
        for book in self.layers:
            with torch.no_grad():
                r = residual.detach()
                if not book.initted:
                    book.kmeans_init(r, self.gen)
                idx = nearest(r, book.embed)
                code = book.embed[idx]  # before this step's update
                if self.training:
                    book.update(r, idx, self.gen)
            loss = loss + COMMITMENT_WEIGHT * F.mse_loss(residual, code)
            quantized = residual + (code - residual).detach()  # straight-through
            residual = residual - quantized.detach()
            total = total + quantized
            indices.append(idx)
        return total, loss, torch.stack(indices, 1)


class CodecTwin(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = make_encoder()
        self.decoder = make_decoder()
        self.quantizer = ResidualVQ()

    def forward(self, x):  # x [N, 1, F]
        n = x.shape[0]
        latent = self.encoder(x)  # [N, D, T]
        t = latent.shape[2]
        z = latent.transpose(1, 2).reshape(n * t, LATENT_DIM)
        q, q_loss, _ = self.quantizer(z)
        y = self.decoder(q.reshape(n, t, LATENT_DIM).transpose(1, 2))
        recon = F.mse_loss(y, x)
        return recon + q_loss, recon


def synthetic_batches(count):
    """`count` batches [16, 1, 1600] of sine mixtures (8 kHz), fixed seed."""
    gen = torch.Generator().manual_seed(1234)
    n = count * BATCH
    t = torch.arange(FRAME, dtype=torch.float64) / 8000.0
    x = torch.zeros(n, FRAME, dtype=torch.float64)
    for _ in range(3):
        freq = 80 + 2900 * torch.rand(n, 1, generator=gen, dtype=torch.float64)
        amp = 0.05 + 0.25 * torch.rand(n, 1, generator=gen, dtype=torch.float64)
        phase = 2 * math.pi * torch.rand(n, 1, generator=gen, dtype=torch.float64)
        x += amp * torch.sin(2 * math.pi * freq * t + phase)
    x += 0.01 * torch.randn(n, FRAME, generator=gen, dtype=torch.float64)
    return list(x.float().reshape(count, BATCH, 1, FRAME).unbind(0))


def wav_batches(root):
    """Batches of 1600-sample frames cut from the 16-bit mono WAVs under root."""
    frames = []
    for dirpath, _, names in sorted(os.walk(root)):
        for name in sorted(names):
            if not name.lower().endswith(".wav"):
                continue
            path = os.path.join(dirpath, name)
            try:
                with wave.open(path, "rb") as w:
                    if w.getsampwidth() != 2 or w.getnchannels() != 1:
                        print(f"skipping {path}: not 16-bit mono", file=sys.stderr)
                        continue
                    data = w.readframes(w.getnframes())
            except (wave.Error, EOFError) as e:
                print(f"skipping {path}: {e}", file=sys.stderr)
                continue
            pcm = array.array("h")
            pcm.frombytes(data[: len(data) // 2 * 2])
            if sys.byteorder != "little":  # WAV samples are little-endian
                pcm.byteswap()
            samples = torch.tensor(pcm, dtype=torch.float32) / 32768.0
            whole = samples.numel() // FRAME
            if whole:
                frames.append(samples[: whole * FRAME].reshape(whole, FRAME))
    if not frames:
        sys.exit(f"--wav {root}: no 16-bit mono WAV file there holds a whole frame of {FRAME} samples")
    x = torch.cat(frames)
    if x.shape[0] < BATCH:
        sys.exit(f"--wav {root}: {x.shape[0]} frames of {FRAME} samples, fewer than one batch of {BATCH}")
    x = x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))]
    count = x.shape[0] // BATCH
    return list(x[: count * BATCH].reshape(count, BATCH, 1, FRAME).unbind(0))


def cosine_lr(step, total):
    if total <= 1:
        return LR
    t = step / (total - 1)
    return LR * (FINAL_LR_FRACTION + (1 - FINAL_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * t)))


def twin_job(config, path):
    """The twin's job: `config` without the losses the twin does not compute."""
    with open(os.path.join(REPO_ROOT, config)) as f:
        job = json.load(f)
    job["model"]["spectral_weight"] = 0
    job["model"]["stoi_weight"] = 0
    with open(path, "w") as f:
        json.dump(job, f)
    return path


def run_vqddp(binary, config, steps, extra):
    with tempfile.TemporaryDirectory(prefix="torch_codec_twin_") as tmp:
        if config == "twin":
            config = twin_job(CONFIG, os.path.join(tmp, "twin_job.json"))
        cmd = [binary, "train", config, "--steps", str(steps), "--dir", os.path.join(tmp, "run"), "--overwrite"]
        cmd += extra
        p = subprocess.run(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rate = None
    for line in p.stdout.splitlines():
        if line.startswith("step ") and "steps/s" in line:
            m = re.search(r"([0-9.]+) steps/s", line)
            if m:
                rate = float(m.group(1))
    if p.returncode != 0 or rate is None:
        tail = "\n".join(p.stdout.splitlines()[-10:])
        print(f"{' '.join(cmd)}: exit {p.returncode}, no steps/s line found; its output ended:\n{tail}",
              file=sys.stderr)
    return rate


def set_mode(mode):
    """PyTorch's float32 settings for a mode (no-ops on the CPU)."""
    fp32 = mode == "eager-fp32"
    torch.backends.cuda.matmul.allow_tf32 = not fp32 and DEFAULT_TF32[0]
    torch.backends.cudnn.allow_tf32 = not fp32 and DEFAULT_TF32[1]


DEFAULT_TF32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def time_twin(mode, a, parameters_expected):
    """Trains a fresh twin in `mode`; returns steps/s (warm-up excluded)."""
    set_mode(mode)
    torch.manual_seed(0)
    model = CodecTwin().to(DEVICE)
    params = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in params)
    if parameters_expected is not None and count != parameters_expected:
        sys.exit(f"torch twin has {count} trainable parameters, vqddp's model {parameters_expected}: the twin is wrong")
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=1e-8, weight_decay=WEIGHT_DECAY)
    batches = [b.to(DEVICE) for b in (wav_batches(a.wav) if a.wav else synthetic_batches(32))]
    total = a.warmup + a.steps
    model.train()
    forward = torch.compile(model, mode="reduce-overhead") if mode == "compile" else model

    def step(i):
        x = batches[i % len(batches)]
        for g in opt.param_groups:
            g["lr"] = cosine_lr(i, total)
        opt.zero_grad(set_to_none=True)
        loss, recon = forward(x)
        loss.backward()
        nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        opt.step()
        return loss, recon

    for i in range(a.warmup):
        step(i)
    sync()
    start = time.perf_counter()
    for i in range(a.warmup, total):
        loss, recon = step(i)
    sync()
    secs = time.perf_counter() - start
    rate = a.steps / secs
    print(f"torch twin ({mode}, {DEVICE.type}, size {a.size}): {a.steps} steps in {secs:.2f} s, {rate:.2f} steps/s "
          f"(torch {torch.__version__}, {a.threads} threads, {count} parameters)")
    print(f"  last step: loss {loss.item():.5f}, recon {recon.item():.5f}", flush=True)
    return rate


def main():
    global CHANNELS, FRAME, BATCH, DEVICE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--vqddp", help="path of the vqddp binary: run it on the same job as the baseline")
    ap.add_argument("--wav", help="directory of 16-bit mono WAV files to cut frames from (default: synthetic)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--size", default="main", choices=sorted(SIZES))
    ap.add_argument("--mode", default="eager-fp32", choices=["eager-fp32", "eager-default", "compile", "all"])
    ap.add_argument("--rounds", type=int, default=1,
                    help="with --vqddp: twin and vqddp in turn this many times, each round's ratios and their median")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < 0 or a.threads < 1 or a.rounds < 1:
        ap.error("--steps, --threads and --rounds must be positive, --warmup not negative")
    if a.wav and a.size != "main":
        ap.error("--wav cuts frames of the main job's size only")
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: PyTorch sees no CUDA device")
    CHANNELS, FRAME, BATCH, config, expected = SIZES[a.size]
    DEVICE = torch.device(a.device)

    torch.set_num_threads(a.threads)
    modes = ["eager-fp32", "eager-default", "compile"] if a.mode == "all" else [a.mode]
    binary = os.path.abspath(a.vqddp) if a.vqddp else None
    device = ["--device", a.device]
    runs = [("4 thread ranks", device + ["--world", "4"]), ("world 1", device + ["--world", "1"])]
    ratios = {}  # (label, mode) -> each round's vqddp/torch
    for round_ in range(1, a.rounds + 1):
        if a.rounds > 1:
            print(f"round {round_} of {a.rounds}")
        rates = {}
        for mode in modes:
            try:
                rates[mode] = time_twin(mode, a, expected)
            except Exception as e:  # a mode this PyTorch cannot run is reported, the others still run
                print(f"torch twin ({mode}): failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        if not binary:
            continue
        # The twin's job (the main job without the losses the twin lacks),
        # then, for the main size, the main job itself.
        job = "twin" if a.size == "main" else config
        what = ", the twin's job" if job == "twin" else ""
        for label, extra in runs:
            y = run_vqddp(binary, job, a.steps, extra)
            if y is None:
                print(f"vqddp ({label}, {a.device}, size {a.size}): no rate (see above)")
                continue
            for m, r in rates.items():
                ratios.setdefault((label, m), []).append(y / r)
            shown = ", ".join(f"vqddp/torch {m} {y / r:.2f}" for m, r in rates.items())
            print(f"vqddp ({label}, {a.device}, size {a.size}{what}): {y:.2f} steps/s; {shown}", flush=True)
        if a.size == "main":
            for label, extra in runs:
                y = run_vqddp(binary, config, a.steps, extra)
                if y is not None:
                    print(f"vqddp ({label}, {a.device}, the main job with its STFT and STOI losses): {y:.2f} steps/s",
                          flush=True)
    if a.rounds > 1:
        for (label, m), v in ratios.items():
            v = sorted(v)
            median = (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2
            print(f"median over {len(v)} rounds: vqddp ({label}) / torch {m} {median:.2f} "
                  f"(from {v[0]:.2f} to {v[-1]:.2f})")

if __name__ == "__main__":
    main()
