#!/bin/sh
# The FLAC example end to end through the executable, as a user runs it:
# FLAC copies of the asterisk prompts made by `vqddp convert` (libsndfile),
# examples/speech_codec_flac.json trained on them (its data path,
# runs/asterisk_flac, is relative to the working directory), one prompt
# encoded at two bitrates and decoded, and the run's report written.
#   flac_example.sh VQDDP EXAMPLES_DIR STEPS
set -eu
vqddp=$1
examples=$2
steps=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$vqddp" convert /usr/share/asterisk/sounds/en_US_f_Allison/*.wav --out runs/asterisk_flac
test "$(ls runs/asterisk_flac/*.flac | wc -l)" -gt 100
"$vqddp" train "$examples/speech_codec_flac.json" --steps "$steps" --world 2
ckpt=runs/speech_codec_flac/checkpoint.safetensors
"$vqddp" encode $ckpt runs/asterisk_flac/activated.flac --out codes
"$vqddp" encode $ckpt runs/asterisk_flac/activated.flac --out codes-low --bitrate 3.2
"$vqddp" decode $ckpt codes/activated.codes --out decoded
"$vqddp" decode $ckpt codes-low/activated.codes --out decoded-low
test -s decoded/activated.wav
test -s decoded-low/activated.wav
"$vqddp" report runs/speech_codec_flac
grep -q '<audio' runs/speech_codec_flac/report.html
echo "flac_example: ok"
