#!/usr/bin/env python3
"""Trains each shipped example of docs/models.md's table to its end and prints
the table's rows from the runs' own records (run.json, metrics.jsonl:
train/run_record.h), so the figures there are measured, never typed.

usage: scripts/model_figures.py [VQDDP_EXE] [--only NAME] [--dir D]

Each run is `vqddp train examples/NAME.json --dir D/NAME --overwrite`, timed
by the wall clock; the SNR, STOI, log-mel L1 and code use are the last
validation line's, the nominal bitrate run.json's. An audio run is then
scored by `vqddp eval CHECKPOINT --held-out` on the clips it held out: the
kbit/s its codes files take (the bytes stored). The main job's run is also
scored beside the classic codecs of --against on the same clips: a second
table. Paste both into docs/models.md with the date, the machine and the
commit. Python 3 standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# config -> the model column (what the config builds, in words).
MODELS = {
    "speech_codec": "conv_codec 8-64-128, strides 8 x 5, residual VQ 2 x 256, STFT and STOI losses, 3 voices",
    "speech_codec_spectral": "the same with 4 x 256 codes, STFT loss 0.002, one voice (the main job before issue 61 + STFT loss)",
    "speech_codec_mlp": "mlp 256 x 2, residual VQ 4 x 256",
    "fashion_conv_vqvae": "conv_vqvae 32-64, 7 x 7 tokens, VQ 512",
    "fashion_vq": "mlp 512, 16 tokens, VQ 512",
    "fashion_simvq": "the same, SimVQ 512, rotation trick",
    "fashion_grouped_rvq": "the same, 2 groups x residual VQ 2 x 64, rotation trick",
    "fashion_fsq": "mlp 512, 16 tokens, latent 4, FSQ 8-5-5-5",
    "fashion_fsp": "the same, FSP 8-5-5-5 (tanh, perturbed in every training step)",
    "fashion_latent_quantize": "the same, LatentQuantize 8-5-5-5 (latents unbounded, as the reference)",
    "fashion_grouped_rfsq": "the same, 2 groups x residual FSQ 2 x (8, 5)",
    "fashion_grouped_rlfq": "the same, 2 groups x residual LFQ 2 x 4 codes",
}


def fmt(x, digits):
    return "" if x is None else f"{x:.{digits}f}"


def evaluate(exe, run_dir, against=""):
    """`vqddp eval` of a run's checkpoint on its held-out clips: the JSON."""
    out = os.path.join(run_dir, "eval.json")
    cmd = [exe, "eval", os.path.join(run_dir, "checkpoint.safetensors"), "--held-out", "--json", out]
    if against:
        cmd += ["--against", against]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def classic_rows(result):
    """The second table: every system of one eval, its totals."""
    rows = []
    for s in result["systems"]:
        t = s["total"]
        rows.append(f"| {s['name']} | {t['kbps']:.2f} | {t['stoi']:.3f} | {t['estoi']:.3f} | {t['si_sdr_db']:.2f} dB | "
                    f"{t['snr_db']:.2f} dB | {t['log_mel_l1']:.3f} | {t['stft_distance']:.3f} | {t['rtf']:.4f} |")
    return rows


def row(name, exe, out_dir):
    run_dir = os.path.join(out_dir, name)
    start = time.monotonic()
    subprocess.run([exe, "train", os.path.join(ROOT, "examples", name + ".json"), "--dir", run_dir, "--overwrite"],
                   check=True, stdout=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    validation = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if any(k.startswith("validation_") for k in j):
                validation = j
    stored = ""
    if run.get("sample_rate", 0) > 0:
        rate = f"{run['bitrate'] / 1000:.2f} kbit/s"
        stored = f"{evaluate(exe, run_dir)['systems'][0]['total']['kbps']:.2f} kbit/s"
    else:
        rate = f"{run['bits_per_example']:.0f} bits/image"
    layers = (validation or {}).get("validation_layers", [])
    sizes = run.get("layer_sizes", [])
    used = "/".join(str(l.get("codes_used", "?")) for l in layers)
    if layers and all(l.get("codes_used") is not None for l in layers):
        used += f" of {'/'.join(str(k) for k in sizes)}" if len(set(sizes)) > 1 else f" of {sizes[0]}"
        used += " (" + "/".join(f"{l['perplexity']:.3g}" for l in layers if l.get("perplexity") is not None) + ")"
    snr = fmt((validation or {}).get("validation_snr_db"), 2)
    mel = fmt((validation or {}).get("validation_log_mel_l1"), 3)
    stoi = fmt((validation or {}).get("validation_stoi"), 3)
    return (f"| `{name}.json` | {MODELS.get(name, '')} | {rate} | {stored} | {snr} dB | {stoi} | {mel} | {used} | "
            f"{seconds:.0f} s |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe", nargs="?", default=os.path.join(ROOT, "build", "vqddp"))
    ap.add_argument("--only", default="")
    ap.add_argument("--dir", default="/tmp/vqddp-figures")
    ap.add_argument("--against", default="opus:6,opus:8,codec2:3200,codec2:1300",
                    help="classic codecs scored beside the main job (speech_codec) on its held-out clips")
    a = ap.parse_args()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    print(f"commit {commit.strip()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    print("| config | model | bitrate | stored | validation SNR | STOI | log-mel L1 | codes used per layer (perplexity) "
          "| time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in MODELS:
        if a.only and a.only != name:
            continue
        print(row(name, a.exe, a.dir))
        sys.stdout.flush()
    if a.against and (not a.only or a.only == "speech_codec"):
        result = evaluate(a.exe, os.path.join(a.dir, "speech_codec"), a.against)
        seconds = result["systems"][0]["total"]["seconds"]
        print(f"\n`vqddp eval` on the main job's {len(result['clips'])} held-out clips ({seconds:.0f} s; "
              f"{len(result['left_out'])} too short for STOI left out):\n")
        print("| system | kbit/s stored | STOI | ESTOI | SI-SDR | SNR | log-mel L1 | MR-STFT | RTF |")
        print("|---|---|---|---|---|---|---|---|---|")
        for line in classic_rows(result):
            print(line)


if __name__ == "__main__":
    main()
