#!/usr/bin/env python3
"""Numpy reference for the EMA codebook training step (golden-file generator).

This script is ONLY run by hand to regenerate the golden files
``ema_euclidean.safetensors`` and ``ema_cosine.safetensors`` that sit next to
it; the C++ test suite reads those files and never runs this script.

    cd /work/main && /usr/bin/python3 tests/vq/golden/ema_reference.py

The output is deterministic (fixed numpy seed). Needs numpy only; the
safetensors writer/reader below is self-contained (struct + json).

Algorithm (one step on a batch x [N, D], codebook size K), float32 state:
  embed [K,D], embed_avg [K,D], cluster_size [K].
  init: embed = embed0, embed_avg = embed0.copy(), cluster_size = ones(K)
        (cosine: embed0 is l2-normalised first, embed_avg is that copy).
  1. euclidean: d = |x|^2 - 2 x.e + |e|^2, index = argmin (ties -> lowest k)
     cosine:    x_hat = x / max(|x|, 1e-12), index = argmax x_hat.e
  2. quantize = embed[index]   (codebook from BEFORE the update)
  3. counts[k] (float32), sums[k] = sum of x (cosine: x_hat) rows with index k
     (float64 accumulation, cast to float32)
  4. cluster_size = decay*cluster_size + (1-decay)*counts
     embed_avg    = decay*embed_avg    + (1-decay)*sums      (float32)
  5. n = sum(cluster_size) (float64)
     cs = (cluster_size + eps) / (n + K*eps) * n   (float64, cast to float32)
     embed = embed_avg / cs[:, None]                (float32)
     cosine: embed = l2-normalise rows of that.
  6. loss = commitment_weight * mean((quantize - x)^2) (ORIGINAL x, float64
     accumulation, stored float32); perplexity = exp(-sum p ln p), p = counts/N.
     Empty batch (N = 0): counts = sums = 0, loss = 0, perplexity = 1.0, and
     the EMA still decays (steps 4-5 run as usual).
"""

import json
import os
import struct

import numpy as np

F32 = np.float32

# ----------------------------------------------------------------------------
# Hyper-parameters / data layout
# ----------------------------------------------------------------------------
K = 16
D = 8
BATCH_SIZES = [40, 33, 0, 50, 17, 64]
STEPS = len(BATCH_SIZES)
DECAY = F32(0.9)
ONE_MINUS_DECAY = F32(1.0) - DECAY  # computed in float32, as C++ `1.0f - decay`
EPS = 1e-5
COMMITMENT_WEIGHT = 0.25
MIN_GAP = 1e-3  # minimum best/second-best score gap for robust golden indices
SEED = 20240607

OUT_DIR = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------
# Minimal safetensors writer / reader
# ----------------------------------------------------------------------------
_DTYPES = {"F32": np.dtype("<f4"), "I64": np.dtype("<i8")}


def write_safetensors(path, tensors, metadata):
    """tensors: list of (name, np.ndarray) in the order they are packed."""
    header = {}
    blobs = []
    offset = 0
    for name, arr in tensors:
        if arr.dtype == np.float32:
            dt = "F32"
        elif arr.dtype == np.int64:
            dt = "I64"
        else:
            raise TypeError(f"{name}: unsupported dtype {arr.dtype}")
        raw = np.ascontiguousarray(arr, dtype=_DTYPES[dt]).tobytes()
        header[name] = {
            "dtype": dt,
            "shape": [int(s) for s in arr.shape],
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)  # pad with spaces to a multiple of 8
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Returns (dict name -> ndarray, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    assert hlen % 8 == 0
    header = json.loads(data[8 : 8 + hlen].decode("utf-8"))
    body = data[8 + hlen :]
    metadata = header.pop("__metadata__", {})
    out = {}
    end_max = 0
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = _DTYPES[info["dtype"]]
        arr = np.frombuffer(body[b:e], dtype=dt).reshape(info["shape"])
        assert arr.nbytes == e - b
        out[name] = arr.copy()
        end_max = max(end_max, e)
    assert end_max == len(body), "trailing bytes / gaps in data section"
    return out, metadata


# ----------------------------------------------------------------------------
# Reference algorithm
# ----------------------------------------------------------------------------
def l2_normalise(a):
    """Row-wise a / max(||a||_2, 1e-12); norm accumulated in float64."""
    a = np.asarray(a, dtype=F32)
    norm = np.sqrt(np.sum(a.astype(np.float64) ** 2, axis=1))
    norm = np.maximum(norm, 1e-12).astype(F32)
    return (a / norm[:, None]).astype(F32)


def scores(x, embed, cosine):
    """Score matrix [N,K] in float32; best = argmin (euclid) / argmax (cosine).

    Returns (scores_f32, scores_f64_exact, x_used) where x_used is x_hat for
    cosine and x otherwise.
    """
    if cosine:
        xu = l2_normalise(x)
        s32 = (xu @ embed.T).astype(F32)
        s64 = xu.astype(np.float64) @ embed.astype(np.float64).T
    else:
        xu = x
        x2 = np.sum(x.astype(np.float64) ** 2, axis=1).astype(F32)
        e2 = np.sum(embed.astype(np.float64) ** 2, axis=1).astype(F32)
        s32 = (x2[:, None] - F32(2) * (x @ embed.T) + e2[None, :]).astype(F32)
        x64, e64 = x.astype(np.float64), embed.astype(np.float64)
        s64 = (
            np.sum(x64**2, 1)[:, None] - 2 * x64 @ e64.T + np.sum(e64**2, 1)[None, :]
        )
    return s32, s64, xu


def pick(s, cosine):
    # np.argmin/argmax return the first (lowest k) index on ties.
    return np.argmax(s, axis=1) if cosine else np.argmin(s, axis=1)


def bad_rows(s32, s64, cosine):
    """Rows whose best/second-best gap is < MIN_GAP or whose f32/f64 pick differs."""
    if s32.shape[0] == 0:
        return np.zeros(0, dtype=bool)
    srt = np.sort(s64, axis=1)
    gap = (srt[:, -1] - srt[:, -2]) if cosine else (srt[:, 1] - srt[:, 0])
    return (gap < MIN_GAP) | (pick(s32, cosine) != pick(s64, cosine))


def ema_step(state, x, cosine):
    """One training step. state = dict(embed, embed_avg, cluster_size), updated
    in place. Returns (indices int64 [N], loss f32 scalar, perplexity f32)."""
    embed = state["embed"]
    n = x.shape[0]

    # 1-2. assignment with the pre-update codebook
    s32, _, xu = scores(x, embed, cosine)
    idx = pick(s32, cosine).astype(np.int64) if n else np.zeros(0, np.int64)
    quantize = embed[idx]

    # 3. counts and per-code sums (float64 accumulation)
    counts = np.bincount(idx, minlength=K).astype(F32)
    sums64 = np.zeros((K, D), dtype=np.float64)
    np.add.at(sums64, idx, xu.astype(np.float64))
    sums = sums64.astype(F32)

    # 4. EMA updates (float32 arithmetic)
    state["cluster_size"] = (
        DECAY * state["cluster_size"] + ONE_MINUS_DECAY * counts
    ).astype(F32)
    state["embed_avg"] = (DECAY * state["embed_avg"] + ONE_MINUS_DECAY * sums).astype(
        F32
    )

    # 5. Laplace-smoothed cluster sizes, new codebook
    cs = state["cluster_size"]
    n_total = float(np.sum(cs.astype(np.float64)))
    cs_smoothed = (
        (cs.astype(np.float64) + EPS) / (n_total + K * EPS) * n_total
    ).astype(F32)
    new_embed = (state["embed_avg"] / cs_smoothed[:, None]).astype(F32)
    if cosine:
        new_embed = l2_normalise(new_embed)
    state["embed"] = new_embed

    # 6. loss (against ORIGINAL x) and perplexity
    if n == 0:
        loss = F32(0.0)
        perplexity = F32(1.0)
    else:
        diff = (quantize - x).astype(F32).astype(np.float64)
        loss = F32(COMMITMENT_WEIGHT * np.mean(diff**2))
        p = counts.astype(np.float64) / n
        p = p[p > 0]
        perplexity = F32(np.exp(-np.sum(p * np.log(p))))
    return idx, loss, perplexity


# ----------------------------------------------------------------------------
# Data generation
# ----------------------------------------------------------------------------
def draw_batch(rng, n, shift, embed, cosine):
    """Draw x ~ N(0,1) + shift, redrawing any row whose assignment is not robust."""
    x = (rng.standard_normal((n, D)) + shift).astype(F32)
    for _ in range(1000):
        s32, s64, _ = scores(x, embed, cosine)
        bad = bad_rows(s32, s64, cosine)
        if not bad.any():
            return x
        x[bad] = (rng.standard_normal((int(bad.sum()), D)) + shift).astype(F32)
    raise RuntimeError("could not draw a robust batch")


def generate(cosine, seed):
    rng = np.random.default_rng(seed)
    embed0 = rng.standard_normal((K, D)).astype(F32)
    e_init = l2_normalise(embed0) if cosine else embed0.copy()
    state = {
        "embed": e_init.copy(),
        "embed_avg": e_init.copy(),
        "cluster_size": np.ones(K, dtype=F32),
    }
    tensors = [("embed0", embed0)]
    xs, outs = [], []
    for i, n in enumerate(BATCH_SIZES):
        shift = (0.5 * rng.standard_normal(D)).astype(F32)  # per-step shift
        x = draw_batch(rng, n, shift, state["embed"], cosine)
        idx, loss, ppl = ema_step(state, x, cosine)
        xs.append((f"x.{i}", x))
        outs += [
            (f"embed.{i}", state["embed"].copy()),
            (f"embed_avg.{i}", state["embed_avg"].copy()),
            (f"cluster_size.{i}", state["cluster_size"].copy()),
            (f"indices.{i}", idx),
            (f"loss.{i}", np.array(loss, dtype=F32)),
            (f"perplexity.{i}", np.array(ppl, dtype=F32)),
        ]
        print(
            f"  step {i}: N={n:3d} codes hit={len(np.unique(idx)):2d} "
            f"loss={float(loss):.6f} perplexity={float(ppl):.6f}"
        )
    tensors += xs + outs
    metadata = {
        "K": str(K),
        "D": str(D),
        "steps": str(STEPS),
        "decay": "0.9",
        "eps": "1e-05",
        "commitment_weight": "0.25",
        "cosine": "true" if cosine else "false",
        "cluster_size_init": "ones",
        "embed0_normalised": "false",
    }
    return tensors, metadata


def main():
    for cosine, name, seed in [
        (False, "ema_euclidean.safetensors", SEED),
        (True, "ema_cosine.safetensors", SEED + 1),
    ]:
        print(name)
        tensors, metadata = generate(cosine, seed)
        path = os.path.join(OUT_DIR, name)
        write_safetensors(path, tensors, metadata)

        # Round-trip check with the independent reader.
        back, meta_back = read_safetensors(path)
        assert meta_back == metadata
        assert list(back.keys()) == [t[0] for t in tensors]
        for tname, arr in tensors:
            assert back[tname].dtype == arr.dtype, tname
            assert back[tname].shape == arr.shape, tname
            assert np.array_equal(back[tname], arr), tname
        size = os.path.getsize(path)
        assert size < 200 * 1024
        print(f"  wrote {path} ({size} bytes), round trip OK")


if __name__ == "__main__":
    main()
