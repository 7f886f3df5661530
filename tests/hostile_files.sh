#!/bin/sh
# What a hostile or careless user tries against encode, decode, convert and
# report, through the executable: planted links are never followed, an
# interrupted or failed command leaves no partial file or empty directory,
# short and truncated audio is refused, an edited codes file is refused,
# and the report embeds no file from outside the run.
#   hostile_files.sh VQDDP SOURCE_ROOT
set -eu
v=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
asterisk=/usr/share/asterisk/sounds/en_US_f_Allison
fail() {
  echo "hostile_files: FAIL: $*" >&2
  exit 1
}
# Refused with exit status 1 and TEXT in the message.
refused() {
  text=$1
  shift
  if out=$("$@" 2>&1); then fail "accepted: $*"; fi
  case "$out" in *"$text"*) ;; *) fail "'$*' said '$out', not '$text'" ;; esac
}
# A 16-bit mono WAV header at RATE Hz promising BYTES bytes of samples.
le32() { printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"; }
wav_header() {
  printf 'RIFF'; le32 $(($2 + 36)); printf 'WAVEfmt '; le32 16
  printf '\001\000\001\000'; le32 "$1"; le32 $(($1 * 2)); printf '\002\000\020\000data'; le32 "$2"
}

# The main job on 20 clips a source: its codec and rate, but a held-out set
# the sanitized build validates in seconds (all 100 clips took it 60 s a run).
sed -e 's/"holdout_every": 10,/"holdout_every": 10, "max_files": 20,/' "$src/examples/speech_codec.json" > codec.json
grep -q '"max_files": 20' codec.json || fail "the config edit did not happen"
"$v" train codec.json --steps 4 --world 1 --dir run > /dev/null
ck=run/checkpoint.safetensors
echo precious > victim

# Codes: entropy-coded (10 s at 3.2 kbit/s packed: 4,000 bytes of codes), packed and coded rates printed,
# inspect reads them without the checkpoint.
{ wav_header 8000 160000; head -c 160000 /dev/urandom; } > ten.wav
"$v" encode $ck ten.wav --out codes | grep -q 'packed 3.20 kbit/s, coded' || fail "encode printed no packed and coded rates"
size=$(wc -c < codes/ten.codes)
[ "$size" -le 12000 ] || fail "a 10 s codes file takes $size bytes"
"$v" inspect codes/ten.codes | grep -q 'packed 3.200 kbit/s (4000 bytes of codes), coded' || fail "inspect of a codes file"

# A link planted under the old predictable temporary name is not followed.
mkdir dec
sh -c 'ln -s "$1/victim" "dec/ten.wav.tmp.$$"; exec "$2" decode "$3" codes/ten.codes --out dec' _ \
  "$work" "$v" $ck > /dev/null
[ "$(cat victim)" = precious ] || fail "the victim of a planted temporary was overwritten"
[ -f dec/ten.wav ] && [ ! -L dec/ten.wav ] || fail "decode's output is not a regular file"
# A link where the output goes: refused, and --overwrite replaces the link, not its target.
ln -sf "$work/victim" dec/ten.wav
refused "a symbolic link" "$v" decode $ck codes/ten.codes --out dec
"$v" decode $ck codes/ten.codes --out dec --overwrite > /dev/null
[ "$(cat victim)" = precious ] && [ ! -L dec/ten.wav ] || fail "--overwrite followed the link"

# An edited codes file (a byte of the header's sample count) is refused by the header's checksum; a
# flipped byte in the codes (the file's last) by its chunk's, named; --skip-damaged decodes around it.
flip() {  # flip FILE OFFSET > OUT: the byte at OFFSET xor 1
  b=$(od -An -tu1 -j"$2" -N1 "$1" | tr -d ' ')
  head -c "$2" "$1"; printf "\\$(printf %03o $((b ^ 1)))"; tail -c +$(($2 + 2)) "$1"
}
flip codes/ten.codes 7 > edited.codes
cmp -s edited.codes codes/ten.codes && fail "the edit did not happen"
refused "the header is damaged or was edited" "$v" decode $ck edited.codes --out dec2
[ ! -e dec2 ] || fail "a refused decode left its directory"
flip codes/ten.codes $(($(wc -c < codes/ten.codes) - 1)) > damaged.codes
refused "chunk 1 of 1 (frames 0-49, 0.00-10.00 s) is damaged: its checksum does not match" \
  "$v" decode $ck damaged.codes --out dec2
[ ! -e dec2 ] || fail "a refused decode left its directory"
"$v" decode $ck damaged.codes --out dec2 --skip-damaged 2>&1 | grep -q '1 damaged chunk as silence' \
  || fail "decode --skip-damaged"

# Truncated audio is refused, naming what was promised; no directory is made.
head -c 80044 ten.wav > half.wav
refused "truncated: its header promises 80000 frames (10.00 s) but the file holds 40000 (5.00 s)" \
  "$v" encode $ck half.wav --out codes2
[ ! -e codes2 ] || fail "a refused encode left its directory"
# Two samples at 48 kHz are nothing at 8 kHz: refused, not an empty file.
{ wav_header 48000 4; printf '\001\000\002\000'; } > two.wav
refused "resample to no sample at 8000 Hz" "$v" convert two.wav --rate 8000 --out conv
refused "resample to no sample at 8000 Hz" "$v" encode $ck two.wav --out conv
[ ! -e conv ] || fail "a refused convert left its directory"
refused "--out is empty" "$v" convert two.wav --out ""
# A rate FLAC cannot store: refused, nothing left.
refused "conv/ten.flac: cannot write" "$v" convert ten.wav --rate 1000000 --out conv
[ ! -e conv ] || fail "a failed convert left its directory or a temporary"

# SIGINT while convert writes: the temporary goes, the exit status says SIGINT.
{ wav_header 8000 9600000; head -c 9600000 /dev/urandom; } > long.wav
"$v" convert long.wav --rate 48000 --out cv > /dev/null 2>&1 &
pid=$!
tries=0
until ls cv/*.tmp.* > /dev/null 2>&1; do
  tries=$((tries + 1))
  [ $tries -lt 2000 ] || fail "convert never began writing"
  sleep 0.005
done
kill -INT $pid
status=0
wait $pid || status=$?
[ $status -eq 130 ] || fail "convert stopped by SIGINT exited $status, not 130"
[ -z "$(ls -A cv)" ] || fail "an interrupted convert left $(ls cv)"

# The report embeds no linked file.
echo "the secret" > secret.txt
ln -sf "$work/secret.txt" run/clips/clip_0_original.wav
refused "is a symbolic link" "$v" report run
[ ! -e run/report.html ] || fail "a report was written"

# A run's own lock file and clips directory: a link planted at either is
# refused or not written through, and its target is left as it was.
mkdir -p linked/run elsewhere
echo precious > elsewhere/clip_0_original.wav
ln -s "$work/elsewhere" linked/run/clips
"$v" train codec.json --steps 4 --world 1 --dir linked/run 2> linked/err > /dev/null || fail "train with a linked clips/ failed"
grep -q "clips: is a symbolic link" linked/err || fail "train said nothing of its linked clips/: $(cat linked/err)"
[ "$(cat elsewhere/clip_0_original.wav)" = precious ] && [ "$(ls elsewhere)" = clip_0_original.wav ] \
  || fail "train wrote through a linked clips/"
mkdir locked
ln -s "$work/victim" locked/.lock
refused ".lock is a symbolic link" "$v" train codec.json --steps 4 --world 1 --dir locked
[ "$(cat victim)" = precious ] || fail "a linked .lock had its target overwritten"
echo "hostile_files: ok"
