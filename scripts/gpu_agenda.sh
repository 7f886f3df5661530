#!/usr/bin/env bash
# The standing GPU agenda (../shared/tools/GPU.md) as one command for a lent
# GPU machine, which has no network and none of the Debian -dev packages:
#   bash ../shared/tools/gpu-pack.sh            # here: .gpu/ with the packages
#   bash scripts/gpu_agenda.sh --pack-data      # here: data and Python sources into .gpu/
#   bash scripts/gpu_agenda.sh OUTDIR [SECONDS] # there (carry .gpu): everything, logs in OUTDIR
#   AGENDA=quick bash scripts/gpu_agenda.sh ... # there: build, test_cuda and the replay parity only
#   AGENDA=crc EXAMPLES="a b" bash ...          # there: build, test_cuda, the --profile run on cuda,
#                                               # and those examples on cuda and cpu with their CRCs
# The GPU work (test_cuda, runs on cuda and nccl, benchmarks, the SIGINT stop,
# compute-sanitizer) runs in one lane and the CPU work (the whole meson suite
# but cuda, runs on the cpu, the replay parity against vector-quantize-pytorch)
# in another, beside it, so CPU steps/s here are read with 4-8 cores busy.
# Each item is time-limited and nothing new starts after SECONDS (540).
set -u
if [ "${1:-}" = --pack-data ]; then
  # Data the examples name, at their paths there (a Fashion-MNIST subset:
  # 15000 training and 5000 validation images, to fit the 64 MiB carry), and
  # the reference's pure-Python sources for scripts/replay_parity.py.
  set -e
  mkdir -p .gpu/data/fashion-mnist .gpu/data/Allison/digits .gpu/data/Allison_es .gpu/data/Russian .gpu/py
  python3 - <<'EOF'
import gzip, struct
for name, keep in (("train", 15000), ("t10k", 5000)):
    raw = gzip.open(f"/usr/share/datasets/fashion-mnist/{name}-images-idx3-ubyte.gz").read()
    magic, n, r, c = struct.unpack(">IIII", raw[:16])
    with gzip.open(f".gpu/data/fashion-mnist/{name}-images-idx3-ubyte.gz", "wb", 6) as f:
        f.write(struct.pack(">IIII", magic, keep, r, c) + raw[16:16 + keep * r * c])
EOF
  # libsndfile and libsoxr (data/audio.h), with the codec libraries they link.
  (cd .gpu/debs && apt-get download -qq libsndfile1-dev libsndfile1 libsoxr-dev libsoxr0 libflac12 libvorbis0a \
    libvorbisenc2 libogg0 libopus0 libmpg123-0 libmp3lame0 libgomp1)
  cp /usr/share/asterisk/sounds/en_US_f_Allison/*.wav .gpu/data/Allison/
  cp /usr/share/asterisk/sounds/en_US_f_Allison/digits/*.wav .gpu/data/Allison/digits/
  # The main job's other two voices, every fourth prompt (carry holds 64 MiB
  # in all; the agenda checks bits, not quality).
  ls /usr/share/asterisk/sounds/es_MX_f_Allison/*.wav | awk 'NR % 4 == 1' | xargs cp -t .gpu/data/Allison_es/
  ls /usr/share/asterisk/sounds/ru_RU_f_IvrvoiceRU/*.wav | awk 'NR % 4 == 1' | xargs cp -t .gpu/data/Russian/
  echo "now put vector_quantize_pytorch/, einx/ and frozendict/ (pure Python) into .gpu/py"
  exit 0
fi

out=${1:?usage: gpu_agenda.sh OUTDIR [SECONDS]}
budget=${2:-540}
mkdir -p "$out"
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
stamp() { echo "[$((SECONDS - start)) s] $*"; }

# The examples' data paths.
mkdir -p /usr/share/datasets /usr/share/asterisk/sounds
ln -sfn "$PWD/.gpu/data/fashion-mnist" /usr/share/datasets/fashion-mnist
ln -sfn "$PWD/.gpu/data/Allison" /usr/share/asterisk/sounds/en_US_f_Allison
ln -sfn "$PWD/.gpu/data/Allison_es" /usr/share/asterisk/sounds/es_MX_f_Allison
ln -sfn "$PWD/.gpu/data/Russian" /usr/share/asterisk/sounds/ru_RU_f_IvrvoiceRU

stamp build
# .gpu/build.sh's steps, plus zlib: zlib1g-dev's libz.so points at the
# runtime package, which is not carried, so the link would take libz.a
# (not position-independent) into libvqddp.so; point it at the machine's.
build() {
  mkdir -p /opt/deps
  for f in .gpu/debs/*.deb; do dpkg -x "$f" /opt/deps; done
  local lib=/opt/deps/usr/lib/x86_64-linux-gnu ob=/opt/deps/usr/lib/x86_64-linux-gnu/openblas-pthread
  for l in libopenblas.so libopenblas.so.0 libblas.so libblas.so.3; do
    [ -e "$ob/$l" ] && ln -sf "$ob/$l" "$lib/$l"
  done
  # sndfile.pc names its codecs' .pc files (Requires.private), whose -dev
  # packages are not carried: a shared link needs none of them.
  sed -i '/^Requires.private:/d' "$lib/pkgconfig/sndfile.pc"
  rm -f "$lib/libz.a"
  ln -sf "$(ldconfig -p | sed -n 's/.*libz.so.1 (libc6,x86-64) => //p' | head -1)" "$lib/libz.so"
  source .gpu/env.sh
  command -v pkg-config >/dev/null || ln -sf /opt/deps/usr/bin/pkgconf /opt/deps/usr/bin/pkg-config
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  [ -f build-gpu/build.ninja ] || meson setup build-gpu --buildtype=release -Dcuda=enabled
  ninja -C build-gpu
}
build >"$out/build.log" 2>&1 || { grep -B2 -A8 "FAILED\|error:\|ERROR:" "$out/build.log" | head -60; exit 1; }
tail -3 "$out/build.log"
source .gpu/env.sh
nproc
stamp built

# item NAME SECONDS COMMAND...: runs COMMAND with a limit (never past the
# budget), its output in OUTDIR/NAME.log, and says how it ended and how long it took.
item() {
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  [ "$l" -gt 15 ] || { stamp "$name: skipped (budget)"; return 0; }
  [ "$limit" -lt "$l" ] || limit=$((l - 5))
  local t0=$SECONDS
  timeout -s INT -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  stamp "$name: rc $rc in $((SECONDS - t0)) s"
}

# shellcheck disable=SC2206
examples=(${EXAMPLES:-speech_codec fashion_vq fashion_conv_vqvae speech_codec_fsq speech_codec_lfq speech_codec_mlp
  speech_codec_spectral fashion_fsq fashion_lfq fashion_simvq fashion_grouped_rvq fashion_residual_simvq
  fashion_grouped_rlfq fashion_grouped_rfsq fashion_fsp fashion_latent_quantize})

# Every example for 300 steps: examples_on NAME SECONDS ARGS... (logs ex_NAME_EXAMPLE).
examples_on() {
  local name=$1 limit=$2
  shift 2
  for e in "${examples[@]}"; do
    item "ex_${name}_$e" "$limit" build-gpu/vqddp train "examples/$e.json" "$@" --steps 300 --dir "/tmp/ex/${name}_$e"
  done
}

gpu_lane() {
  item test_cuda 150 build-gpu/tests/test_cuda
  [ "${AGENDA:-}" = quick ] && return
  # A world of one replaying one captured CUDA graph per step
  # (run.step_graphs, never run on a GPU before) against the same steps
  # issued launch by launch: steps/s of each, and the two checkpoints must
  # be equal tensor by tensor (vqddp inspect, or scripts' safetensors diff).
  item main_graph 90 build-gpu/vqddp train --device cuda --world 1 --steps 500 --dir /tmp/gw1
  item main_nograph 90 build-gpu/vqddp train --device cuda --world 1 --step-graphs off --steps 500 --dir /tmp/gw0
  # The main job's step op by op on the GPU (each op waited for), with its
  # launches per step, for sim's count of the same run (cpu lane).
  item profile_cuda 60 build-gpu/vqddp train --device cuda --steps 50 --profile --dir /tmp/p
  item profile_cuda_w1 60 build-gpu/vqddp train --device cuda --world 1 --steps 50 --profile --dir /tmp/p1
  if [ "${AGENDA:-}" = crc ]; then
    examples_on cuda 40 --device cuda
    return
  fi
  # vqddp against its PyTorch twin on this GPU, in one process each size:
  # eager fp32 (TF32 off), eager defaults, torch.compile(reduce-overhead).
  item twin_main 200 env PYTHONUNBUFFERED=1 python3 bench/torch_codec_twin.py --device cuda --mode all \
    --steps 300 --vqddp build-gpu/vqddp
  item twin_10x 200 env PYTHONUNBUFFERED=1 python3 bench/torch_codec_twin.py --device cuda --mode all --size 10x \
    --steps 100 --warmup 10 --vqddp build-gpu/vqddp
  item main_cuda 90 build-gpu/vqddp train --device cuda --steps 500 --dir /tmp/g
  item main_nccl 90 build-gpu/vqddp train --backend nccl --steps 500 --dir /tmp/n
  item bench_cuda_codebook_step 60 build-gpu/bench/bench_cuda_codebook_step bench/torch_ema_step.py
  item bench_nccl_allreduce 30 build-gpu/bench/bench_nccl_allreduce
  item bench_device_transfers 60 build-gpu/bench/bench_device_transfers --device cuda --steps 100 examples/speech_codec.json
  # SIGINT after the first log line: it must checkpoint, say how to resume, and the resume must run.
  (
    rm -rf /tmp/s
    build-gpu/vqddp train --backend nccl --steps 300 --dir /tmp/s >"$out/sigint.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do grep -q '"loss"' /tmp/s/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
    kill -INT $pid; wait $pid; echo "sigint: exit $?" >>"$out/sigint.log"
    resume=$(sed -n 's/^resume with: //p' "$out/sigint.log")
    echo "sigint: resume line: $resume" >>"$out/sigint.log"
    [ -n "$resume" ] && timeout 60 bash -c "$resume" >>"$out/sigint.log" 2>&1
    echo "sigint: resume exit $?" >>"$out/sigint.log"
  )
  stamp "sigint: $(grep -c '^sigint' "$out/sigint.log") lines"
  examples_on cuda 40 --device cuda
  item sanitizer 120 compute-sanitizer --tool memcheck --report-api-errors no build-gpu/tests/test_cuda
  examples_on nccl 40 --backend nccl
}

cpu_lane() {
  if [ "${AGENDA:-}" = crc ]; then
    examples_on cpu 60 --device cpu
    return
  fi
  [ "${AGENDA:-}" = quick ] ||
    item suite 240 meson test -C build-gpu --no-rebuild --print-errorlogs --num-processes 8 --no-suite gpu
  item parity 120 env PYTHONPATH="$PWD/.gpu/py" python3 scripts/replay_parity.py build-gpu/vqddp --world 4
  [ "${AGENDA:-}" = quick ] && return
  item main_cpu 120 build-gpu/vqddp train --device cpu --steps 500 --dir /tmp/c
  item profile_sim 60 build-gpu/vqddp train --device sim --steps 50 --profile --dir /tmp/ps
  item profile_sim_w1 60 build-gpu/vqddp train --device sim --world 1 --steps 50 --profile --dir /tmp/ps1
  examples_on cpu 40 --device cpu
}

gpu_lane >"$out/gpu_lane.txt" 2>&1 &
gpu=$!
cpu_lane >"$out/cpu_lane.txt" 2>&1
wait $gpu
cat "$out/gpu_lane.txt" "$out/cpu_lane.txt"

# Checkpoints of cuda and cpu runs, tensor by tensor (CRC per tensor).
for e in "${examples[@]}"; do
  a=/tmp/ex/cuda_$e/checkpoint.safetensors b=/tmp/ex/cpu_$e/checkpoint.safetensors
  [ -f "$a" ] && [ -f "$b" ] || { echo "crc $e: missing"; continue; }
  build-gpu/vqddp inspect "$a" | grep '^tensor' >/tmp/ia; build-gpu/vqddp inspect "$b" | grep '^tensor' >/tmp/ib
  echo "crc $e: $(diff /tmp/ia /tmp/ib | grep -c '^<') of $(wc -l </tmp/ia) tensors differ"
done >"$out/crc.txt"
cat "$out/crc.txt"
# One summary file: the last lines of each log (the figures).
for f in "$out"/*.log; do
  echo "== $(basename "$f")"
  case $(basename "$f") in
    profile_*|twin_*) grep -E '^(total|torch twin|vqddp \(|done:)' "$f" ;;
    *) tail -4 "$f" ;;
  esac
done >"$out/summary.txt"
stamp done
