#!/usr/bin/env bash
# Installs the Debian packages vqddp needs, only those that are missing, so a
# machine that already has them runs no apt-get at all. Needs root (or sudo).
set -euo pipefail

packages=(
  g++ meson ninja-build pkg-config   # toolchain
  libfmt-dev nlohmann-json3-dev doctest-dev  # libraries (header-only but fmt)
  libopenblas-dev                    # CPU GEMM
  zlib1g-dev                         # gzip IDX files
  libsndfile1-dev libsoxr-dev        # audio files of any format, resampled to one rate
  libopus-dev libcodec2-dev          # vqddp eval: classic codecs coded beside ours at equal bitrate
  libopenmpi-dev openmpi-bin         # the MPI backend (--backend mpi) and mpirun
  iproute2                           # tests/two_nodes.sh: two nodes as network namespaces
  slurm-wlm munge                    # tests/slurm_jobs.sh: a real Slurm cluster on this machine
  asterisk-core-sounds-en-wav        # real speech: the default training run (Allison, English)
  asterisk-core-sounds-es-wav        # more languages and voices for the codecs: Allison (Spanish),
  asterisk-core-sounds-fr-wav        # June (French; held out of the speech codecs' training, docs/models.md)
  asterisk-core-sounds-ru-wav        # and a Russian voice
  asterisk-core-sounds-it-wav        # two Italian voices, Carlo (a man) and Menardi:
  asterisk-prompt-it-menardi-wav     # examples/speech_codec_large.json, codec_recipe.py's five_voices
  dataset-fashion-mnist              # real images: the VQ-VAE examples
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# No daemon starts on install (munge, slurmctld, slurmd: the Slurm test
# starts its own, on its own ports and files): a policy-rc.d that refuses
# every start, for this install only, where the machine has none (or only
# one this script left, killed midway: marked, so it is known and removed).
# Debian still enables the services for the next boot, where slurmctld and
# slurmd stop at once without /etc/slurm/slurm.conf and munge runs.
policy=/usr/sbin/policy-rc.d
marker="# vqddp scripts/deps.sh: refuse daemon starts during its install"
if [ ! -e "$policy" ] || grep -qxF "$marker" "$policy"; then
  trap '$sudo rm -f "$policy"' EXIT
  printf '#!/bin/sh\n%s\nexit 101\n' "$marker" | $sudo tee "$policy" > /dev/null
  $sudo chmod +x "$policy"
fi
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
