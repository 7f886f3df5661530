#!/usr/bin/env python3
"""The speech codec's recipe, measured: trains the main job's config and each
variant of it below (one choice changed), scores every checkpoint with
`vqddp eval` on a speaker no run trains on, and prints docs/models.md's
recipe table, the classic codecs on the same clips beside it.

usage: scripts/codec_recipe.py [VQDDP_EXE] [--only NAME,...] [--dir D]
                               [--base examples/speech_codec.json] [--bitrates KBIT/S,...]

The held-out speaker is June (Debian's asterisk-core-sounds-fr-wav,
fr_CA_f_June): every prompt of its top directory of at least 1.5 s
(24,000 bytes of 16-bit samples and header), which is long enough for
STOI. The shipped speech configs train on Allison (English, Spanish) and
the Russian voice (the large config on the two Italian voices too), never
on June. Each run is `vqddp train CONFIG --dir
D/NAME --overwrite`, timed by the wall clock (so run it on an idle
machine); every figure is `vqddp eval`'s total over the clips (kbit/s of
the bytes stored, entropy coding included). With --bitrates each checkpoint
is also scored at each `vqddp eval --bitrate` (the most residual layers
whose codes file is within it), a row each: a codec trained with quantize
dropout at every rate it serves. With another --base, `main` is that config
as shipped (`--base examples/speech_codec_large.json --only main --bitrates
6,1.4`: the large config). Python 3 standard library only.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELD_OUT = "/usr/share/asterisk/sounds/fr_CA_f_June"
MIN_BYTES = 24000

# name -> (what changes, the overrides: dotted keys of the base config).
ALLISON_EN = "/usr/share/asterisk/sounds/en_US_f_Allison"
# The five voices are the large config's, listed there once.
with open(os.path.join(ROOT, "examples", "speech_codec_large.json")) as f:
    LARGE = json.load(f)
VARIANTS = {
    "main": ("the main job: 200 tokens/s x 2 x 256 codes, waveform L2 + STFT 0.01 + STOI loss 0.01, 3 voices", {}),
    "one_voice": ("trained on Allison's English prompts alone (the main job's data before)",
                  {"data.sources": [{"path": ALLISON_EN, "weight": 3}, {"path": ALLISON_EN + "/digits", "weight": 1}]}),
    "five_voices": ("+ the two Italian voices (asterisk-core-sounds-it-wav's Carlo, a man, and "
                    "asterisk-prompt-it-menardi-wav's Menardi), weight 2 each",
                    {"data.sources": LARGE["data"]["sources"]}),
    "waveform_only": ("waveform L2 alone (no STFT, no STOI loss)", {"model.spectral_weight": 0.0, "model.stoi_weight": 0.0}),
    "no_stoi_loss": ("no STOI loss", {"model.stoi_weight": 0.0}),
    "stoi_loss_0.1": ("STOI loss 0.1", {"model.stoi_weight": 0.1}),
    "mel_not_stft": ("log-mel loss 0.3 (DAC's) instead of the STFT loss", {"model.spectral_weight": 0.0,
                                                                         "model.mel_weight": 0.3}),
    "100_tokens_per_s": ("100 tokens/s x 4 x 256 (strides 8-5-2, channels 8-64-128-128)",
                         {"model.strides": [8, 5, 2], "model.channels": [8, 64, 128, 128],
                          "quantizer.num_quantizers": 4}),
    "50_tokens_per_s": ("50 tokens/s x 6 x 1024 (strides 8-5-4, channels 8-64-128-256)",
                        {"model.strides": [8, 5, 4], "model.channels": [8, 64, 128, 256],
                         "quantizer.num_quantizers": 6, "quantizer.codebook_size": 1024}),
    "wider": ("channels 16-96-192", {"model.channels": [16, 96, 192]}),
    "4_layers": ("4 x 256 codes: twice the bits (6.4 kbit/s)", {"quantizer.num_quantizers": 4}),
    "twice_the_steps": ("6600 steps: twice the compute", {"schedule.steps": 6600}),
    "causal": ("causal (model.causal): every convolution sees only the past, a 5 ms frame of latency",
               {"model.causal": True}),
}


def held_out_clips():
    if not os.path.isdir(HELD_OUT):
        sys.exit(f"codec_recipe: {HELD_OUT} is missing (scripts/deps.sh installs asterisk-core-sounds-fr-wav)")
    names = sorted(n for n in os.listdir(HELD_OUT) if n.endswith(".wav"))
    return [os.path.join(HELD_OUT, n) for n in names if os.path.getsize(os.path.join(HELD_OUT, n)) >= MIN_BYTES]


def json_without_comments(path):
    with open(path) as f:
        return json.loads("\n".join(l for l in f if not l.lstrip().startswith("//")))


def configured(base, overrides, run_dir):
    cfg = json.loads(json.dumps(base))
    for key, value in overrides.items():
        node = cfg
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    cfg["run"]["dir"] = run_dir
    return cfg


def evaluate(exe, checkpoint, clips, out, against="", bitrate=""):
    cmd = [exe, "eval", checkpoint, *clips, "--json", out]
    if against:
        cmd += ["--against", against]
    if bitrate:
        cmd += ["--bitrate", bitrate]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)["systems"]


def row(system, what, seconds=None):
    t = system["total"]
    time_text = "" if seconds is None else f"{seconds:.0f} s"
    return (f"| {what} | {t['kbps']:.2f} | {t['stoi']:.3f} | {t['estoi']:.3f} | {t['log_mel_l1']:.3f} | "
            f"{t['stft_distance']:.3f} | {t['snr_db']:.2f} dB | {time_text} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe", nargs="?", default=os.path.join(ROOT, "build", "vqddp"))
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--dir", default="/tmp/vqddp-recipe")
    ap.add_argument("--base", default=os.path.join(ROOT, "examples", "speech_codec.json"))
    ap.add_argument("--against", default="opus:6,opus:8,codec2:3200,codec2:1300")
    ap.add_argument("--bitrates", default="", help="comma-separated kbit/s: also score each at --bitrate")
    a = ap.parse_args()
    clips = held_out_clips()
    base = json_without_comments(a.base)
    os.makedirs(a.dir, exist_ok=True)
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
    print(f"commit {commit.strip()}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}, base {os.path.relpath(a.base, ROOT)}; "
          f"held out: {len(clips)} clips of {HELD_OUT}")
    print("| variant | kbit/s stored | STOI | ESTOI | log-mel L1 | MR-STFT | SNR | train time |")
    print("|---|---|---|---|---|---|---|---|")
    only = set(filter(None, a.only.split(",")))
    unknown = only - set(VARIANTS)
    if unknown:
        sys.exit(f"codec_recipe: no variant {', '.join(sorted(unknown))} (known: {', '.join(VARIANTS)})")
    run_dir = ""
    for name, (what, overrides) in VARIANTS.items():
        if only and name not in only:
            continue
        run_dir = os.path.join(a.dir, name)
        config = os.path.join(a.dir, name + ".json")
        with open(config, "w") as f:
            json.dump(configured(base, overrides, run_dir), f, indent=1)
        start = time.monotonic()
        subprocess.run([a.exe, "train", config, "--overwrite"], check=True, stdout=subprocess.DEVNULL)
        seconds = time.monotonic() - start
        if name == "main" and os.path.basename(a.base) != "speech_codec.json":
            what = f"`{os.path.basename(a.base)}` as shipped"
        checkpoint = os.path.join(run_dir, "checkpoint.safetensors")
        systems = evaluate(a.exe, checkpoint, clips, os.path.join(run_dir, "held_out.json"))
        print(row(systems[0], f"`{name}`: {what}" + (", every layer" if a.bitrates else ""), seconds))
        for rate in filter(None, a.bitrates.split(",")):
            systems = evaluate(a.exe, checkpoint, clips, os.path.join(run_dir, f"held_out_{rate}.json"), bitrate=rate)
            print(row(systems[0], f"`{name}` at --bitrate {rate}"))
        sys.stdout.flush()
    if a.against and run_dir:
        # The classic codecs need a checkpoint to run beside: the last run's.
        systems = evaluate(a.exe, os.path.join(run_dir, "checkpoint.safetensors"), clips,
                           os.path.join(a.dir, "classic.json"), a.against)
        for s in systems[1:]:
            print(row(s, s["name"]))


if __name__ == "__main__":
    main()
