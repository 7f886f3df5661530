#!/usr/bin/env python3
"""Our STOI (train/stoi.h) against an independent implementation, pystoi, on
the same audio: a checkpoint's held-out clips, coded and decoded by it.

usage: scripts/stoi_against_pystoi.py PYSTOI_DIR CHECKPOINT [VQDDP_EXE]

PYSTOI_DIR is a checkout of https://github.com/mpariente/pystoi (not a
dependency of vqddp; it is only read here). Needs Debian's python3-numpy and
python3-scipy. Runs `vqddp eval CHECKPOINT --held-out --json`, then encode
and decode (float WAV) of the same clips, and prints each clip's STOI and
ESTOI from both and the largest difference.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from scipy.io import wavfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    rate, x = wavfile.read(path)
    if x.dtype == np.int16:
        x = x.astype(np.float64) / 32768
    return rate, x.astype(np.float64)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.path.insert(0, sys.argv[1])
    from pystoi import stoi  # noqa: E402 (from the checkout given)
    checkpoint = sys.argv[2]
    exe = sys.argv[3] if len(sys.argv) > 3 else os.path.join(ROOT, "build", "vqddp")
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "eval.json")
        subprocess.run([exe, "eval", checkpoint, "--held-out", "--json", report], check=True, stdout=subprocess.DEVNULL)
        with open(report) as f:
            ev = json.load(f)
        subprocess.run([exe, "encode", checkpoint, *ev["clips"], "--out", os.path.join(tmp, "codes")], check=True,
                       stdout=subprocess.DEVNULL)
        codes = sorted(os.path.join(tmp, "codes", c) for c in os.listdir(os.path.join(tmp, "codes")))
        subprocess.run([exe, "decode", checkpoint, *codes, "--out", os.path.join(tmp, "wav"), "--float"], check=True,
                       stdout=subprocess.DEVNULL)
        worst = worst_e = 0.0
        for i, clip in enumerate(ev["clips"]):
            rate, x = read(clip)
            _, y = read(os.path.join(tmp, "wav", os.path.splitext(os.path.basename(clip))[0] + ".wav"))
            ours = ev["systems"][0]["clips"][i]
            s, e = stoi(x, y, rate), stoi(x, y, rate, extended=True)
            worst, worst_e = max(worst, abs(s - ours["stoi"])), max(worst_e, abs(e - ours["estoi"]))
            print(f"{os.path.basename(clip):32s} STOI vqddp {ours['stoi']:.4f} pystoi {s:.4f} | "
                  f"ESTOI vqddp {ours['estoi']:.4f} pystoi {e:.4f}")
        print(f"largest difference over {len(ev['clips'])} clips: STOI {worst:.4f}, ESTOI {worst_e:.4f}")


if __name__ == "__main__":
    main()
