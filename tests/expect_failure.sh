#!/bin/sh
# Runs a command that must fail in one specific way: with exit status CODE
# and TEXT somewhere in its output. A negative test that accepted any
# failure would also pass on a crash, a missing file or a typo.
#   expect_failure.sh CODE TEXT COMMAND [ARGS...]
code=$1
text=$2
shift 2
out=$("$@" 2>&1)
got=$?
printf '%s\n' "$out"
if [ "$got" -ne "$code" ]; then
  echo "expect_failure: exit status $got, expected $code" >&2
  exit 1
fi
case "$out" in
  *"$text"*) exit 0 ;;
esac
echo "expect_failure: output lacks '$text'" >&2
exit 1
