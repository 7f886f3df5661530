#!/bin/sh
# `vqddp encode --stream | vqddp decode --stream` as a voice link, through
# the real executable and real pipes, on a 10-minute stream:
# - clean: exit 0 both sides, every sample back;
# - a flipped byte and a cut-out stretch: decode names both on stderr,
#   exits 3, conceals the lost frames (the output keeps its length), and
#   from a few frames after the damage on its samples are the clean
#   stream's again, bit for bit (a causal decoder forgets the damage once
#   its receptive field has passed it);
# - a reader that closes the pipe early ends either side with status 0;
# - refused with status 1, naming it: a stream decoded with another
#   checkpoint, a codec that is not causal, raw PCM at another rate.
#   voice_link.sh VQDDP SOURCE_DIR
set -u
vqddp=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "voice_link: $*" >&2; [ -f "$tmp/err" ] && cat "$tmp/err" >&2; exit 1; }

"$vqddp" train "$src/examples/speech_codec_causal.json" --steps 20 --world 1 --dir "$tmp/run" > /dev/null 2>&1 ||
  fail "training the causal codec failed"
"$vqddp" train "$src/examples/speech_codec_causal.json" --steps 10 --world 1 --dir "$tmp/other" > /dev/null 2>&1 ||
  fail "training the second causal codec failed"
"$vqddp" train "$src/examples/speech_codec_mlp.json" --steps 2 --world 1 --dir "$tmp/mlp" > /dev/null 2>&1 ||
  fail "training the non-causal codec failed"
ck=$tmp/run/checkpoint.safetensors

# Ten minutes of 8 kHz 16-bit noise (the link's behaviour does not depend
# on what the sound is).
bytes=9600000
head -c $bytes /dev/urandom > "$tmp/in.raw"
"$vqddp" encode --stream "$ck" < "$tmp/in.raw" > "$tmp/clean.vqs" 2> "$tmp/err" || fail "encode exited $?"
"$vqddp" decode --stream "$ck" < "$tmp/clean.vqs" > "$tmp/clean.raw" 2> "$tmp/err" || fail "decode of the clean stream exited $?"
[ "$(wc -c < "$tmp/clean.raw")" -eq $bytes ] || fail "the clean stream decoded to $(wc -c < "$tmp/clean.raw") bytes, not $bytes"
# The same through one pipe, as a link runs.
{ "$vqddp" encode --stream "$ck" < "$tmp/in.raw" 2> /dev/null; echo $? > "$tmp/rc.enc"; } |
  { "$vqddp" decode --stream "$ck" 2> "$tmp/err"; echo $? > "$tmp/rc.dec"; } | cmp -s - "$tmp/clean.raw" ||
  fail "encode | decode differs from the stream decoded from its file"
[ "$(cat "$tmp/rc.enc") $(cat "$tmp/rc.dec")" = "0 0" ] || fail "encode | decode exited $(cat "$tmp/rc.enc") and $(cat "$tmp/rc.dec")"

# Damage: one byte flipped a third of the way in, 40 bytes cut out two
# thirds of the way in.
size=$(wc -c < "$tmp/clean.vqs")
flip=$((size / 3))
cut=$((2 * size / 3))
head -c $flip "$tmp/clean.vqs" > "$tmp/damaged.vqs"
old=$(od -An -tu1 -j $flip -N1 "$tmp/clean.vqs" | tr -d ' ')
if [ "$old" = 1 ]; then printf '\002'; else printf '\001'; fi >> "$tmp/damaged.vqs"
head -c $cut "$tmp/clean.vqs" | tail -c +$((flip + 2)) >> "$tmp/damaged.vqs"
tail -c +$((cut + 41)) "$tmp/clean.vqs" >> "$tmp/damaged.vqs"
"$vqddp" decode --stream "$ck" < "$tmp/damaged.vqs" > "$tmp/damaged.raw" 2> "$tmp/err"
rc=$?
[ $rc -eq 3 ] || fail "decode of the damaged stream exited $rc, not 3"
grep -q "damaged bytes at stream offset" "$tmp/err" || fail "the damage is not named"
[ "$(grep -c "lost before packet" "$tmp/err")" -eq 2 ] || fail "not two losses named"
grep -q "concealed by repeating the last frame's codes" "$tmp/err" || fail "no concealment named"
[ "$(wc -c < "$tmp/damaged.raw")" -eq $bytes ] || fail "the damaged stream decoded to $(wc -c < "$tmp/damaged.raw") bytes, not $bytes"
# Before the flipped packet and from a second after the cut, the clean bits.
head -c $((bytes / 4)) "$tmp/damaged.raw" > "$tmp/damaged.head"
head -c $((bytes / 4)) "$tmp/clean.raw" > "$tmp/clean.head"
cmp -s "$tmp/clean.head" "$tmp/damaged.head" || fail "the samples before the damage differ from the clean stream's"
tail -c $((bytes / 4)) "$tmp/clean.raw" > "$tmp/clean.tail"
tail -c $((bytes / 4)) "$tmp/damaged.raw" > "$tmp/damaged.tail"
cmp -s "$tmp/clean.tail" "$tmp/damaged.tail" || fail "the samples long after the damage differ from the clean stream's"

# A reader that goes away: either side stops with status 0.
{ "$vqddp" decode --stream "$ck" < "$tmp/clean.vqs" 2> "$tmp/err"; echo $? > "$tmp/rc"; } | head -c 1000 > /dev/null
[ "$(cat "$tmp/rc")" = 0 ] || fail "decode with its reader gone exited $(cat "$tmp/rc")"
grep -q "standard output closed by its reader" "$tmp/err" || fail "decode did not say its reader went"
{ "$vqddp" encode --stream "$ck" < "$tmp/in.raw" 2> "$tmp/err"; echo $? > "$tmp/rc"; } | head -c 100 > /dev/null
[ "$(cat "$tmp/rc")" = 0 ] || fail "encode with its reader gone exited $(cat "$tmp/rc")"
grep -q "standard output closed by its reader" "$tmp/err" || fail "encode did not say its reader went"
# The input's writer gone mid-packet: the cut packet is named, status 3.
head -c $((size / 2)) "$tmp/clean.vqs" | "$vqddp" decode --stream "$ck" > /dev/null 2> "$tmp/err"
rc=$?
[ $rc -eq 3 ] || fail "decode of a stream cut short exited $rc, not 3"
grep -q "ended without its last packet" "$tmp/err" || fail "the cut is not named"

# Refused, status 1.
refused() {  # MESSAGE COMMAND...
  message=$1
  shift
  "$@" < "$tmp/in.raw" > /dev/null 2> "$tmp/err"
  rc=$?
  [ $rc -eq 1 ] || fail "$* exited $rc, not 1"
  grep -qF -- "$message" "$tmp/err" || fail "$*: the error does not say '$message'"
}
refused "the stream was coded by codec" sh -c '"$0" decode --stream "$1" < "$2"' "$vqddp" \
  "$tmp/other/checkpoint.safetensors" "$tmp/clean.vqs"
refused "the codec is not causal" "$vqddp" encode --stream "$tmp/mlp/checkpoint.safetensors"
refused "--rate 16000 Hz; the codec codes 8000 Hz" "$vqddp" encode --stream "$ck" --rate 16000
exit 0
