#!/usr/bin/env bash
# Two "nodes" on this machine: network namespaces joined by a veth pair
# (node A 10.77.0.1, node B 10.77.0.2, nothing else reachable), each with
# its own hostname (a UTS namespace per process tree), so MPI and the
# rendezvous see two hosts talking TCP over a link this script can cut.
# The namespaces are this run's own (named after its pid) and always
# removed (trap). Exits 77 when they cannot be made (not root, no
# CAP_NET_ADMIN, no `ip`), or when the build has no MPI.
#
#   two_nodes.sh HAVE_MPI VQDDP CONFIG MODE [STORE_PEER [DELAY_PROGRAM]]
#     train      2 nodes x 2 MPI processes train STEPS steps over TCP: the
#                checkpoint's tensors are those of 4 thread ranks
#     link-down  the link cut mid-run: every process ends within the
#                deadline, naming the collective; the last checkpoint is
#                whole; --resume on node A alone (4 thread ranks) ends in the
#                bytes of an uninterrupted run
#     kill       a process of node B killed (SIGKILL) mid-run: the same
#     data-differs node B's data set has one file fewer: every rank refuses
#                at the start, naming the ranks that differ
#     other-build  node B runs another vqddp build (other bytes): the same
#     other-config node B's config differs (another lr): the same
#     slow       the link between the nodes delays every packet DELAY_MS
#                (DELAY_PROGRAM, a relay between tun devices): the run goes
#                on, slower, to the bits of 4 thread ranks
#     launch     `vqddp launch --nnodes 2` on each node, the store on node A:
#                the rendezvous of 2 x 2 processes completes (STORE_PEER, the
#                test program of the rendezvous, as each process); a node B
#                with another token is refused
# Times (fault to the last process gone, steps/s) are printed for the note.
set -u
have_mpi=$1 vqddp=$2 config=$3 mode=$4 store_peer=${5:-} delay_link=${6:-}
[ "$have_mpi" = true ] || { echo "two_nodes: skipped, this build has no MPI"; exit 77; }
command -v ip > /dev/null && command -v mpirun > /dev/null && command -v unshare > /dev/null ||
  { echo "two_nodes: skipped, needs ip (iproute2), unshare and mpirun"; exit 77; }

# `ip netns` and the mount namespaces below need a real root mount: in a
# chroot (/ not a mount point) `ip netns exec` fails after `ip netns add`
# has already mounted /run/netns there. So probe first, changing nothing.
unshare --mount sh -c 'mount --make-rslave /' 2>/dev/null ||
  { echo "two_nodes: skipped, mount namespaces are not usable here (not root, or / is not a mount point: a chroot)"; exit 77; }

id=$$
A=vqA$id B=vqB$id
tmp=$(mktemp -d)
# /run/netns is made a mount point by the first `ip netns add`; undone at
# the end if this run made it and no other namespace is left in it.
run_netns_mounted=false
mountpoint -q /run/netns 2>/dev/null && run_netns_mounted=true
cleanup() {
  ip netns pids "$A" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns pids "$B" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$A" 2>/dev/null
  ip netns del "$B" 2>/dev/null
  if [ $run_netns_mounted = false ] && mountpoint -q /run/netns 2>/dev/null && [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "two_nodes $mode: $*" >&2; for f in "$tmp"/*.out; do [ -f "$f" ] && { echo "== $f" >&2; tail -40 "$f" >&2; }; done; exit 1; }

if ! ip netns add "$A" 2>/dev/null || ! ip netns add "$B" 2>/dev/null ||
   ! ip link add "va$id" netns "$A" type veth peer name "vb$id" netns "$B" 2>/dev/null; then
  echo "two_nodes: skipped, cannot make network namespaces here (needs root with CAP_NET_ADMIN)"
  exit 77
fi
ip -n "$A" addr add 10.77.0.1/24 dev "va$id" && ip -n "$A" link set "va$id" up && ip -n "$A" link set lo up &&
ip -n "$B" addr add 10.77.0.2/24 dev "vb$id" && ip -n "$B" link set "vb$id" up && ip -n "$B" link set lo up ||
  fail "could not configure the veth pair"

# How mpirun reaches a node (its rsh agent): a shell in that node's
# namespaces, as ssh would give, with the node's own hostname.
cat > "$tmp/agent" <<EOF
#!/bin/sh
host=\$1
shift
case \$host in
  10.77.0.1) ns=$A name=node-a ;;
  10.77.0.2) ns=$B name=node-b ;;
  *) echo "agent: unknown node \$host" >&2; exit 255 ;;
esac
# Node B's own files: "SOURCE TARGET" lines of $tmp/b_mounts, bound over
# TARGET in a mount namespace of its own (another data set, build or config).
mounts=true
[ \$ns = $B ] && [ -s $tmp/b_mounts ] && mounts='while read -r s t; do mount --bind "\$s" "\$t" || exit 1; done < $tmp/b_mounts'
exec ip netns exec \$ns unshare --uts --mount --propagation private sh -c "\$mounts; hostname \$name; \$*"
EOF
chmod +x "$tmp/agent"

# A config with a short deadline, so a fault ends the run in seconds, and a
# checkpoint every 20 steps, so one is on disk before the fault.
sed -e 's/"timeout_s": *[0-9.]*/"timeout_s": 10/' -e 's/"checkpoint_every": *[0-9]*/"checkpoint_every": 20/' \
  -e 's/"log_every": *[0-9]*/"log_every": 20/' "$config" > "$tmp/config.json"
grep -q '"timeout_s": 10' "$tmp/config.json" || fail "$config has no distributed.timeout_s to shorten"

# mpirun on node A; 2 processes per node, ranks 0-1 on A and 2-3 on B; TCP
# only (no shared memory: the nodes are "apart"), over the veth alone. The
# keepalive: a cut link gives no TCP error, so without probes mpirun and
# node B's daemon would wait for each other for ever (Open MPI's default
# probes start after 300 s); with these a dead link is seen within about
# 6 s (1 s idle, then 5 probes 1 s apart). That must come well before the
# ranks' own deadline (timeout_s 10 here): a rank that times out first
# makes its daemon send to the dead peer, and a socket with data unacked
# waits out TCP's retransmissions (minutes), not the keepalive; with 10
# probes (11 s) node B's daemon outlived the run by over 30 s. Not fewer
# probes either: with 2 (3 s) mpirun ended a healthy CI run over the slow
# link ("ORTE has lost communication with a remote daemon"), most likely
# two probes of the idle daemon connection lost in a row while the ranks'
# traffic filled a tun device's queue (500 packets then) faster than the
# relay read it on two busy cores.
mpi_train() {  # DIR STEPS [extra train args]
  local dir=$1 steps=$2
  shift 2
  ip netns exec "$A" unshare --uts sh -c 'hostname node-a; exec "$@"' sh \
    timeout 300 mpirun --allow-run-as-root --oversubscribe --bind-to none \
    --host 10.77.0.1:2,10.77.0.2:2 -np 4 --map-by slot \
    --mca plm_rsh_agent "$tmp/agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    --mca oob_tcp_keepalive_time 1 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 5 \
    "$vqddp" train "$tmp/config.json" --backend mpi --steps "$steps" --dir "$dir" "$@"
}

tensors() { "$vqddp" inspect "$1/checkpoint.safetensors" | grep '^tensor '; }

steps=${STEPS:-60}
case $mode in
  train)
    start=$(date +%s%N)
    mpi_train "$tmp/mpi" "$steps" > "$tmp/mpi.out" 2>&1 || fail "the 2x2 run failed"
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    grep -q "4 ranks (mpi, cpu)" "$tmp/mpi.out" || fail "the run did not report 4 mpi ranks"
    "$vqddp" train "$tmp/config.json" --world 4 --steps "$steps" --dir "$tmp/thread" > "$tmp/thread.out" 2>&1 ||
      fail "the 4 thread rank run failed"
    tensors "$tmp/mpi" > "$tmp/mpi.tensors" && tensors "$tmp/thread" > "$tmp/thread.tensors" || fail "inspect failed"
    [ -s "$tmp/mpi.tensors" ] || fail "no tensors listed"
    diff "$tmp/mpi.tensors" "$tmp/thread.tensors" > /dev/null || fail "the 2x2 checkpoint differs from 4 thread ranks'"
    grep "^step " "$tmp/mpi.out" | tail -1
    echo "two_nodes train: $steps steps on 2 nodes x 2 mpi processes over TCP in $took ms (mpirun included)" \
         "== 4 thread ranks, $(wc -l < "$tmp/mpi.tensors") tensors bit-identical" ;;
  link-down|kill)
    # The uninterrupted run, for the resume's bytes.
    "$vqddp" train "$tmp/config.json" --world 4 --steps "$steps" --dir "$tmp/straight" > "$tmp/straight.out" 2>&1 ||
      fail "the uninterrupted run failed"
    mpi_train "$tmp/mpi" "$steps" > "$tmp/mpi.out" 2>&1 &
    job=$!
    # The fault once a checkpoint is on disk (checkpoint_every steps in).
    waited=0
    until [ -f "$tmp/mpi/checkpoint.safetensors" ]; do
      sleep 0.05
      waited=$((waited + 1))
      [ $waited -lt 2400 ] || { kill $job; fail "no checkpoint after 120 s"; }
      kill -0 $job 2> /dev/null || fail "the run ended before its first checkpoint"
    done
    sleep 0.5
    fault=$(date +%s%N)
    if [ "$mode" = link-down ]; then
      ip -n "$A" link set "va$id" down || fail "could not cut the link"
    else
      victim=""
      for pid in $(ip netns pids "$B"); do
        case "$(tr '\0' ' ' < /proc/$pid/cmdline 2>/dev/null)" in *"$vqddp train"*) victim=$pid ;; esac
      done
      [ -n "$victim" ] || fail "no vqddp process found on node B"
      kill -KILL "$victim"
    fi
    wait $job
    rc=$?
    [ $rc -ne 0 ] || fail "the run exited 0 after the fault"
    [ $rc -ne 124 ] || fail "the run did not end within 300 s"
    # mpirun has ended; a process on the far side of a cut link learns it
    # only at its own deadline: wait for the last one (at most 30 s).
    waited=0
    while [ -n "$( (ip netns pids "$A"; ip netns pids "$B") | head -1)" ]; do
      [ $waited -lt 600 ] || fail "processes alive 30 s after the run ended: $( (ip netns pids "$A"; ip netns pids "$B") |
        while read -r p; do tr '\0' ' ' < /proc/$p/cmdline; echo; done)"
      sleep 0.05
      waited=$((waited + 1))
    done
    gone=$(( ($(date +%s%N) - fault) / 1000000 ))
    # What names the fault: mpirun's "lost communication with a remote
    # daemon ... on node 10.77.0.2" or "process rank 3 ... on node 10.77.0.2
    # exited on signal 9", or a rank's own deadline naming the collective.
    # Open MPI 4.1.4's mpirun sometimes crashes in PMIx_Finalize while it
    # ends the job (status 139, no message of its own): said, not failed.
    if ! grep -qE "TimeoutError|did not complete|lost communication|exited on signal 9" "$tmp/mpi.out"; then
      [ $rc -eq 139 ] || fail "no message names what did not complete"
      echo "two_nodes $mode: note: mpirun crashed ending the job (Open MPI's PMIx_Finalize), so it named nothing"
    fi
    "$vqddp" inspect "$tmp/mpi/checkpoint.safetensors" > "$tmp/inspect.out" 2>&1 ||
      fail "the last checkpoint is not whole"
    at=$(sed -n 's/.*: step \([0-9]*\),.*/\1/p' "$tmp/inspect.out" | head -1)
    # Node A alone resumes: 4 thread ranks, the same bytes as no fault.
    "$vqddp" train "$tmp/config.json" --world 4 --steps "$steps" --dir "$tmp/mpi" \
      --resume "$tmp/mpi/checkpoint.safetensors" > "$tmp/resume.out" 2>&1 || fail "the resume failed"
    cmp -s "$tmp/straight/checkpoint.safetensors" "$tmp/mpi/checkpoint.safetensors" ||
      fail "the resumed run's checkpoint differs from the uninterrupted run's"
    grep -E "TimeoutError|did not complete|lost communication|signal 9" "$tmp/mpi.out" | head -3
    echo "two_nodes $mode: every process gone $gone ms after the fault (deadline 10 s), exit status $rc;" \
         "checkpoint of step ${at:-?} whole; resumed on node A alone to the uninterrupted run's bytes" ;;
  data-differs|other-build|other-config)
    # Node B differs in one thing; every rank must refuse at the start.
    case $mode in
      data-differs)
        data=/usr/share/asterisk/sounds/en_US_f_Allison
        cp -r "$data" "$tmp/fewer" && rm "$(ls "$tmp"/fewer/*.wav | head -1)" || fail "cannot copy the data"
        echo "$tmp/fewer $data" > "$tmp/b_mounts"
        expect="the ranks loaded different data: rank 0 has .* these ranks differ from it: rank 2 .*, rank 3" ;;
      other-build)
        built=$(ldd "$vqddp" | sed -n 's/.*libvqddp[^ ]* => \([^ ]*\).*/\1/p')
        [ -n "$built" ] || built=$vqddp
        cp "$built" "$tmp/other-build" && printf 'x' >> "$tmp/other-build" || fail "cannot copy the build"
        echo "$tmp/other-build $built" > "$tmp/b_mounts"
        expect="the ranks run different vqddp builds: rank 0 runs build [0-9a-f]*, and rank 2 runs [0-9a-f]*, rank 3 runs" ;;
      other-config)
        sed 's/"lr": *[0-9.]*/"lr": 0.001/' "$tmp/config.json" > "$tmp/other-config.json"
        echo "$tmp/other-config.json $tmp/config.json" > "$tmp/b_mounts"
        expect="the ranks run different configs: rank 0's has fingerprint [0-9a-f]*, and rank 2 has [0-9a-f]*, rank 3 has" ;;
    esac
    start=$(date +%s%N)
    mpi_train "$tmp/mpi" "$steps" > "$tmp/mpi.out" 2>&1 && fail "the run started although node B differs"
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    refused=$(grep -c "$expect" "$tmp/mpi.out")
    [ "$refused" -eq 4 ] || fail "expected all 4 ranks to refuse with '$expect', $refused did"
    grep -q "^step " "$tmp/mpi.out" && fail "a step was trained"
    grep -m1 "$expect" "$tmp/mpi.out"
    echo "two_nodes $mode: refused on all 4 ranks before the first step, $took ms after mpirun started" ;;
  slow)
    [ -x "$delay_link" ] || fail "slow needs the delay_link program as the 6th argument"
    "$vqddp" train "$tmp/config.json" --world 4 --steps "$steps" --dir "$tmp/thread" > "$tmp/thread.out" 2>&1 ||
      fail "the 4 thread rank run failed"
    mpi_train "$tmp/fast" "$steps" > "$tmp/fast.out" 2>&1 || fail "the 2x2 run over the veth failed"
    # The slow link: the veth replaced by a tun device in each node with the
    # same addresses, joined by delay_link, which holds every packet
    # DELAY_MS (default 2) before passing it on.
    ip -n "$A" link del "va$id" || fail "could not remove the veth"
    delay=${DELAY_MS:-2}
    # The relay runs ahead of the 4 ranks (nice -10) so that two busy cores
    # delay it as little as they can: a device's queue that the relay does
    # not read in time drops packets (the devices' counters, printed below).
    nice -n -10 "$delay_link" "$A" "ta$id" "$B" "tb$id" "$delay" > "$tmp/relay.log" 2>&1 &
    relay=$!
    waited=0
    until grep -q ready "$tmp/relay.log"; do
      kill -0 $relay 2>/dev/null || fail "delay_link did not start: $(cat "$tmp/relay.log")"
      sleep 0.05
      waited=$((waited + 1))
      [ $waited -lt 200 ] || fail "delay_link not ready after 10 s"
    done
    # A long device queue (10000 packets, not 500): the kernel drops what
    # the relay has not read yet once the queue is full.
    ip -n "$A" addr add 10.77.0.1/24 dev "ta$id" && ip -n "$A" link set "ta$id" txqueuelen 10000 up &&
    ip -n "$B" addr add 10.77.0.2/24 dev "tb$id" && ip -n "$B" link set "tb$id" txqueuelen 10000 up ||
      fail "could not configure the tun devices"
    mpi_train "$tmp/mpi" "$steps" > "$tmp/mpi.out" 2>&1
    run=$?
    # The devices' counters, read while the relay holds the devices (they
    # go with it): sent packets dropped on a full queue, received ones the
    # far stack dropped. Printed whether the run passed or failed.
    dropped() { ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_dropped" "/sys/class/net/$2/statistics/rx_dropped" | paste -sd/; }
    drops="dropped (sent/received) $(dropped "$A" "ta$id") on node A's device, $(dropped "$B" "tb$id") on node B's"
    kill $relay && wait $relay || fail "delay_link failed: $(cat "$tmp/relay.log")"
    [ $run -eq 0 ] || { { tail -1 "$tmp/relay.log"; echo "$drops"; } > "$tmp/relay.out"; fail "the run over the slow link failed"; }
    # The link was the slow one: every packet of the run held DELAY_MS.
    relayed=$(sed -n 's/^relayed \([0-9]*\) packets, each held at least \([0-9.]*\) ms.*/\1 \2/p' "$tmp/relay.log")
    [ -n "$relayed" ] && awk -v d="$delay" '{ exit !($1 > 1000 && $2 >= d) }' <<< "$relayed" ||
      fail "the run did not go through the delaying link: $(cat "$tmp/relay.log")"
    for d in thread fast mpi; do tensors "$tmp/$d" > "$tmp/$d.tensors" || fail "inspect of $d failed"; done
    diff "$tmp/fast.tensors" "$tmp/thread.tensors" > /dev/null || fail "the run over the veth differs from 4 thread ranks"
    diff "$tmp/mpi.tensors" "$tmp/thread.tensors" > /dev/null || fail "the run over the slow link differs"
    fast=$(sed -n 's/^done: .* in \([0-9.]*\) s.*/\1/p' "$tmp/fast.out")
    slow=$(sed -n 's/^done: .* in \([0-9.]*\) s.*/\1/p' "$tmp/mpi.out")
    echo "two_nodes slow: $steps steps in $slow s over a link delaying every packet $delay ms each way" \
         "($(tail -1 "$tmp/relay.log"); $drops), $fast s over the veth; the same checkpoint tensors as 4 thread ranks" ;;
  launch)
    [ -x "$store_peer" ] || fail "launch needs the store_peer program as the 5th argument"
    export VQDDP_STORE_TOKEN=token-$id
    on() {  # NODE NAME COMMAND...: a process tree in that node
      local ns=$1 name=$2
      shift 2
      ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$name" "$@"
    }
    start=$(date +%s%N)
    on "$A" node-a timeout 60 "$vqddp" launch --nproc 2 --nnodes 2 --node-rank 0 --master-addr 10.77.0.1 \
      --master-port 29533 -- "$store_peer" > "$tmp/a.out" 2>&1 &
    a=$!
    on "$B" node-b timeout 60 "$vqddp" launch --nproc 2 --nnodes 2 --node-rank 1 --master-addr 10.77.0.1 \
      --master-port 29533 -- "$store_peer" > "$tmp/b.out" 2>&1 || fail "node B's launch failed"
    wait $a || fail "node A's launch failed"
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    grep -q "store_peer: 4 ranks agree" "$tmp/a.out" || fail "the 4 ranks did not agree"
    # Node B with another token: refused by the store, not admitted.
    on "$A" node-a timeout 60 "$vqddp" launch --nproc 2 --nnodes 2 --node-rank 0 --master-addr 10.77.0.1 \
      --master-port 29534 -- "$store_peer" --timeout-ms 3000 > "$tmp/a2.out" 2>&1 &
    a=$!
    VQDDP_STORE_TOKEN=another on "$B" node-b timeout 60 "$vqddp" launch --nproc 2 --nnodes 2 --node-rank 1 \
      --master-addr 10.77.0.1 --master-port 29534 -- "$store_peer" --timeout-ms 3000 > "$tmp/b2.out" 2>&1 &&
      fail "node B with another token was admitted"
    wait $a && fail "node A's ranks completed without node B's"
    grep -qi "token" "$tmp/b2.out" || fail "node B's refusal does not say the token differs"
    grep -i -m1 "token" "$tmp/b2.out"
    echo "two_nodes launch: the rendezvous of 2 nodes x 2 processes over TCP completed in $took ms (launch included);" \
         "another token refused" ;;
  *) fail "unknown mode $mode" ;;
esac
