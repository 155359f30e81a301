#!/usr/bin/env bash
# Two-node test of `dscpp launch --launcher ssh` on one machine: each "host" is a network
# namespace (dscpp_n1_<id>, dscpp_n2_<id>) joined by a veth pair (10.231.X.1/24, 10.231.X.2/24),
# and --remote_cmd 'ip netns exec {host} {command}' stands in for ssh. Checks:
#  1. 4 ranks (slots=2 per namespace) run with the right RANK, LOCAL_RANK, WORLD_SIZE and
#     LOCAL_WORLD_SIZE, each in its own namespace, and each reaches the master address over TCP
#     (a perl listener on 10.231.X.1:29500 in the first namespace answers "pong"); with a bare
#     environment on the "hosts" (env -i), NCCL_* variables and the working folder still arrive;
#  2. a rank on the second node exiting 5 stops the whole job within 10 s, the report names
#     that rank, its status, its error line (carried by the agent's failure line) and its
#     last line, and no rank process is left running;
#  3. the main launcher killed with SIGKILL: the node agents (started through `setsid -w`, so
#     only their stdin lifeline tells them, as over ssh) stop their ranks within 10 s;
#  4. `dscpp check` across both: hosts answer, the master port opens on the first host and is
#     reached from both, and the communicator's collectives run over Gloo across the veth pair;
#  5. the same with each namespace its own host (DSCPP_HOST_ID): the hierarchy's collectives.
# Usage: multinode_netns.sh PATH_TO_DSCPP   (as root; needs iproute2, perl, setsid).
# Exit status 0: passed; anything else: failed (including when namespaces cannot be made).
# The namespaces are always deleted (trap).
set -u
DSCPP=${1:?usage: multinode_netns.sh PATH_TO_DSCPP}
ID="$$_${RANDOM}"
N1="dscpp_n1_${ID}"
N2="dscpp_n2_${ID}"
V1="dsva$$"  # interface names: 15 characters at most
V2="dsvb$$"
X=$((($$ % 200) + 20))
MASTER="10.231.${X}.1"
PORT=29500
WORK=$(mktemp -d /tmp/dscpp_netns_XXXXXX)
LISTENER=""

cleanup() {
  [ -n "$LISTENER" ] && kill "$LISTENER" 2>/dev/null
  ip netns del "$N1" 2>/dev/null
  ip netns del "$N2" 2>/dev/null
  ip link del "$V1" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in "$WORK"/*.out "$WORK"/*.err; do
    [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }
  done
  exit 1
}

now() { date +%s.%N; }
elapsed_below() { awk -v a="$1" -v b="$(now)" -v lim="$2" 'BEGIN { exit !(b - a < lim) }'; }

# A pid that still runs (a zombie has exited; init reaps it in its own time).
running() {
  local st
  st=$(awk '{ sub(/.*\) /, ""); print substr($0, 1, 1) }' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != "Z" ]
}

# Waits up to $2 seconds for every pid listed in files under folder $1 to be gone.
all_gone() {
  local dir=$1 limit=$2 start left p
  start=$(now)
  while :; do
    left=""
    for f in "$dir"/*; do
      p=$(cat "$f" 2>/dev/null) || continue
      [ -n "$p" ] && running "$p" && left="$left $p"
    done
    [ -z "$left" ] && return 0
    elapsed_below "$start" "$limit" || { echo "still running:$left" >&2; return 1; }
    sleep 0.1
  done
}

# Waits up to 10 s until folder $1 holds $2 files.
wait_files() {
  local i
  for i in $(seq 100); do
    [ "$(ls "$1" | wc -l)" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

# --- set up two "hosts" ------------------------------------------------------------------
ip netns add "$N1" && ip netns add "$N2" &&
  ip link add "$V1" type veth peer name "$V2" &&
  ip link set "$V1" netns "$N1" && ip link set "$V2" netns "$N2" &&
  ip -n "$N1" addr add "10.231.${X}.1/24" dev "$V1" &&
  ip -n "$N2" addr add "10.231.${X}.2/24" dev "$V2" &&
  ip -n "$N1" link set lo up && ip -n "$N2" link set lo up &&
  ip -n "$N1" link set "$V1" up && ip -n "$N2" link set "$V2" up ||
  fail "cannot create the network namespaces $N1 and $N2 (running as $(id -un); this test needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN, and iproute2)"

HOSTFILE="$WORK/hostfile"
printf '# two namespaces as hosts\n%s slots=2\n%s slots=2\n' "$N1" "$N2" >"$HOSTFILE"

ip netns exec "$N1" perl -MIO::Socket::INET -e '
  my $s = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => $ARGV[1], Listen => 64,
                                ReuseAddr => 1) or die "listen: $!";
  while (my $c = $s->accept) { print $c "pong\n"; close $c; }' "$MASTER" "$PORT" &
LISTENER=$!
for i in $(seq 50); do
  ip netns exec "$N2" bash -c "exec 3<>/dev/tcp/$MASTER/$PORT" 2>/dev/null && break
  [ "$i" = 50 ] && fail "the TCP listener on $MASTER:$PORT in $N1 is not reachable from $N2"
  sleep 0.1
done

LAUNCH=("$DSCPP" launch --hostfile "$HOSTFILE" --launcher ssh
  --remote_cmd 'ip netns exec {host} {command}' --master_addr "$MASTER" --master_port "$PORT")

# --- 1. ranks, environment, reachability ------------------------------------------------
# `env -i` gives the agents a bare environment, as ssh would: NCCL_* and the working folder
# must come through the agent's flags.
mkdir "$WORK/cwd"
(cd "$WORK/cwd" && NCCL_DSCPP_TEST="a b" timeout 30 "$DSCPP" launch --hostfile "$HOSTFILE" \
  --remote_cmd "env -i PATH=$PATH ip netns exec {host} {command}" \
  --master_addr "$MASTER" --master_port "$PORT" bash -c '
  exec 3<>/dev/tcp/$MASTER_ADDR/$MASTER_PORT && read -r reply <&3
  addr=$(ip -4 -o addr show | grep -o "10\.231\.[0-9]*\.[0-9]*" | tr "\n" " ")
  echo "check rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE ns=$(ip netns identify) reach=$reply nccl=$NCCL_DSCPP_TEST pwd=$(pwd) addr=$addr"') \
  >"$WORK/1.out" 2>"$WORK/1.err"
rc=$?
[ "$rc" = 0 ] || fail "1: the job exited with status $rc"
for r in 0 1 2 3; do
  if [ "$r" -lt 2 ]; then ns=$N1 ip="10.231.${X}.1"; else ns=$N2 ip="10.231.${X}.2"; fi
  want="[rank $r] check rank=$r local=$((r % 2)) world=4 lws=2 ns=$ns reach=pong nccl=a b pwd=$WORK/cwd addr=$ip "
  grep -qxF "$want" "$WORK/1.out" || fail "1: missing line '$want'"
done
[ "$(grep -c '^\[rank [0-3]\] check ' "$WORK/1.out")" = 4 ] || fail "1: not exactly 4 ranks ran"
echo "ok 1: 4 ranks on 2 namespaces: environment, NCCL_* and working folder passed, master reachable"

# --- 2. a rank on the second node fails --------------------------------------------------
mkdir "$WORK/pids2"
start=$(now)
timeout 30 "${LAUNCH[@]}" sh -c '
  echo $$ > '"$WORK"'/pids2/sh.$RANK
  sleep 60 & echo $! > '"$WORK"'/pids2/bg.$RANK
  if [ "$RANK" = 3 ]; then
    i=0; while [ "$(ls '"$WORK"'/pids2 | wc -l)" -lt 8 ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
    echo "[2026-11-29 22:30:01.123] [rank 3] [error] rank 3 is broken" >&2
    echo "rank 3 failing now"; exit 5
  fi
  wait' >"$WORK/2.out" 2>"$WORK/2.err"
rc=$?
[ "$rc" = 5 ] || fail "2: the job exited with status $rc, not 5"
elapsed_below "$start" 10 || fail "2: the job took more than 10 s to stop"
grep -qF "cause: rank 3 on $N2 exited with status 5" "$WORK/2.err" || fail "2: report lacks the cause"
grep -qF "  last 1 error line of rank 3 on $N2:" "$WORK/2.err" || fail "2: report lacks the error line"
grep -qF "  | [2026-11-29 22:30:01.123] [rank 3] [error] rank 3 is broken" "$WORK/2.err" ||
  fail "2: report lacks the error line's text"
grep -qF "  | rank 3 failing now" "$WORK/2.err" || fail "2: report lacks the last line"
grep -qF "stopped by the launcher:" "$WORK/2.err" || fail "2: report lacks the stopped list"
all_gone "$WORK/pids2" 3 || fail "2: rank processes left running"
echo "ok 2: rank 3 on the second node exited 5; job stopped, report names it, nothing left"

# --- 3. the main launcher dies: agents lose their stdin lifeline ---------------------------
mkdir "$WORK/pids3"
"$DSCPP" launch --hostfile "$HOSTFILE" --launcher ssh \
  --remote_cmd 'setsid -w ip netns exec {host} {command}' --master_addr "$MASTER" \
  sh -c 'echo $$ > '"$WORK"'/pids3/sh.$RANK; sleep 60 & echo $! > '"$WORK"'/pids3/bg.$RANK; wait' \
  >"$WORK/3.out" 2>"$WORK/3.err" </dev/null &
MAIN=$!
wait_files "$WORK/pids3" 8 || fail "3: the ranks did not start"
sleep 0.2
kill -9 "$MAIN"
wait "$MAIN" 2>/dev/null
all_gone "$WORK/pids3" 10 || fail "3: ranks outlived the main launcher by more than 10 s"
echo "ok 3: main launcher killed; agents stopped their ranks"

# --- 4. dscpp check across the two hosts: hosts answer, the master port opens on the first
# host and is reached from both, and the real communicator (Gloo over the veth pair) runs
# all_reduce / reduce_scatter / all_gather / barrier across the 4 ranks. The namespaces share
# one kernel and /dev/shm, so the ranks would rightly use shared memory; DSCPP_COMM_SHM=off
# (forwarded to the hosts like every DSCPP_ variable) keeps the collectives on the veth pair.
kill "$LISTENER" 2>/dev/null; wait "$LISTENER" 2>/dev/null; LISTENER=""
DSCPP_COMM_SHM=off timeout 90 "$DSCPP" check --hostfile "$HOSTFILE" --remote_cmd 'ip netns exec {host} {command}' \
  --master_addr "$MASTER" --master_port $((PORT + 1)) --sizes_kib 64 --iters 3 \
  >"$WORK/4.out" 2>"$WORK/4.err"
rc=$?
[ "$rc" = 0 ] || fail "4: dscpp check exited with status $rc"
grep -qF "[ ok ] host $N2: answers the remote command, 2 rank(s)" "$WORK/4.out" || fail "4: host $N2 not checked"
grep -qF "[ ok ] master $MASTER:$((PORT + 1)) opens on $N1 and every host reaches it" "$WORK/4.out" || fail "4: master not checked"
grep -qF "collectives across 4 ranks (gloo backend)" "$WORK/4.out" || fail "4: no collective table"
grep -qF "[ ok ] collectives across 4 rank(s) completed with correct results" "$WORK/4.out" || fail "4: collectives failed"
echo "ok 4: dscpp check across 2 namespaces: hosts, master port, collectives over Gloo"

# --- 5. the same with each namespace named a host of its own (DSCPP_HOST_ID, as separate
# machines would be by their host names): collectives go through shared memory inside each host
# and Gloo between them (NOTE [hierarchical collectives]), with correct results.
timeout 90 "$DSCPP" check --hostfile "$HOSTFILE" \
  --remote_cmd 'ip netns exec {host} env DSCPP_HOST_ID={host} {command}' \
  --master_addr "$MASTER" --master_port $((PORT + 2)) --sizes_kib 64,4096 --iters 3 \
  >"$WORK/5.out" 2>"$WORK/5.err"
rc=$?
[ "$rc" = 0 ] || fail "5: dscpp check exited with status $rc"
grep -qF "collectives across 4 ranks (gloo+shm+hosts backend)" "$WORK/5.out" || fail "5: not the hierarchy"
grep -qF "[ ok ] collectives across 4 rank(s) completed with correct results" "$WORK/5.out" || fail "5: collectives failed"
echo "ok 5: 2 hosts of 2 ranks: shared memory inside each host, Gloo between them, correct results"
exit 0
