#!/usr/bin/env bash
# Hosts as network namespaces: several "hosts" on this machine, each a Linux network
# namespace with its own network stack and address, joined by veth pairs to a bridge, so
# that OpenMPI runs across them over TCP as across separate machines. Needs root.
#
#   bash scripts/hosts.sh up N          make N hosts (replacing any left over)
#   bash scripts/hosts.sh down          remove them, whatever state they are in
#   bash scripts/hosts.sh list          the hosts and their addresses
#   bash scripts/hosts.sh mpirun [--on I,J,...] R PROGRAM [ARGS...]
#                                       PROGRAM on every host (or hosts I,J,...), R ranks
#                                       per host, rank r on the (r / R)-th of them
#                                       (mpirun's by-slot placement)
#   bash scripts/hosts.sh kill I        kill -9 every process of host I but OpenMPI's
#                                       daemon (a host whose job processes died)
#   bash scripts/hosts.sh cut I         set host I's link down (a host cut off)
#   bash scripts/hosts.sh slow I RATE   limit host I's link to RATE each way (tc tbf,
#                                       e.g. 30mbit); `slow I off` lifts it
#
# Host i is the namespace distjax-host<i>, address 198.18.0.<i+1>/24 (198.18.0.0/15 is the
# range reserved for network tests, RFC 2544); the bridge distjax-br0 in this namespace is
# 198.18.0.254. mpirun runs on a launch node of its own, the namespace distjax-launcher
# (198.18.0.253), set as a cluster's launch node should be: net.ipv4.tcp_retries2 = 5, so
# that a TCP connection to a host that no longer answers fails after about 13 s of
# retransmissions instead of Linux's default 15 (about 15 minutes), and mpirun ends a job
# whose host was cut off instead of waiting on that host's daemon. Every host has the hostname distjax-host<i> (a UTS
# namespace per launch). OpenMPI reaches a host through this script's `agent` (its remote
# agent, instead of ssh: the command runs inside the host's namespace) and moves every byte
# over TCP on the bridge (btl tcp,self: no shared memory between hosts; ranks of one host
# talk over its loopback).
#
# When a process dies or fails, mpirun ends the others: SIGCONT, SIGTERM 2 s later, SIGKILL
# 2 s after that (odls_base_sigkill_timeout); the first DistJax process to fail after its
# collective found silent peers leaves the others those seconds to report. A host cut off
# is found by the collective timeout (distributed.timeout_s): the ranks on both sides stop
# with an error naming the other; mpirun then ends the job once its connection to the cut
# host's daemon fails (the keepalive below, or tcp_retries2 once it sends to it).
set -euo pipefail

PREFIX=distjax-host
LAUNCHER=distjax-launcher
BRIDGE=distjax-br0
NET=198.18.0
LOCK=/run/distjax-hosts.lock
SELF=$(readlink -f "$0")

die() {
  echo "hosts: $*" >&2
  exit 1
}

hosts() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" | sort -V || true
}

down() {
  local ns link
  for ns in $(hosts); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip netns pids "$LAUNCHER" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns del "$LAUNCHER" 2>/dev/null || true
  # The host ends of the veth pairs go with their namespaces; these are left only when a
  # namespace was never made.
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 |
    grep -E "^dj-veth([0-9]+|L)$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

up() {
  local n=$1 i
  [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 200)) || die "up takes a number of hosts, 1 to 200, got '$n'"
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
  command -v ip >/dev/null || die "needs the ip command (Debian package iproute2)"
  down
  ip link add "$BRIDGE" type bridge || die "cannot make the bridge $BRIDGE (no network namespaces here?)"
  ip addr add "$NET.254/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for ((i = 0; i < n; i++)); do
    ip netns add "$PREFIX$i"
    ip link add "dj-veth$i" type veth peer name eth0 netns "$PREFIX$i"
    ip link set "dj-veth$i" master "$BRIDGE" up
    ip -n "$PREFIX$i" addr add "$NET.$((i + 1))/24" dev eth0
    ip -n "$PREFIX$i" link set eth0 up
    ip -n "$PREFIX$i" link set lo up
  done
  ip netns add "$LAUNCHER"
  ip link add dj-vethL type veth peer name eth0 netns "$LAUNCHER"
  ip link set dj-vethL master "$BRIDGE" up
  ip -n "$LAUNCHER" addr add "$NET.253/24" dev eth0
  ip -n "$LAUNCHER" link set eth0 up
  ip -n "$LAUNCHER" link set lo up
  ip netns exec "$LAUNCHER" sh -c 'echo 5 >/proc/sys/net/ipv4/tcp_retries2' ||
    die "cannot set net.ipv4.tcp_retries2 in the launch node's namespace"
}

list() {
  local ns
  for ns in $(hosts); do
    echo "$ns $NET.$((${ns#"$PREFIX"} + 1))"
  done
}

# OpenMPI's remote agent: `agent ADDRESS COMMAND...` runs the command (a shell line, as ssh
# would) inside the namespace of the host with that address, under the host's name.
agent() {
  local address=$1 i
  shift
  i=$((${address##*.} - 1))
  ip netns list | grep -q "^$PREFIX$i\b" || die "no host has the address $address"
  exec ip netns exec "$PREFIX$i" unshare --uts sh -c "hostname $PREFIX$i; $*"
}

run_mpi() {
  local on="" hostlist="" ns
  if [ "${1:-}" = --on ]; then
    on=,$2,
    shift 2
  fi
  local per_host=${1:-}
  shift || true
  [[ "$per_host" =~ ^[0-9]+$ ]] && ((per_host >= 1)) || die "mpirun takes ranks per host first, got '$per_host'"
  (($# >= 1)) || die "mpirun: no program"
  local n=0
  for ns in $(hosts); do
    [ -z "$on" ] || [[ "$on" == *",${ns#"$PREFIX"},"* ]] || continue
    hostlist+="${hostlist:+,}$NET.$((${ns#"$PREFIX"} + 1)):$per_host"
    n=$((n + 1))
  done
  [ -n "$hostlist" ] || die "no hosts${on:+ among $on}: run 'bash scripts/hosts.sh up N' first"
  local ranks=$((per_host * n)) exports=() var
  # The ranks get this environment's OpenMP and DistJax settings (mpirun passes no others).
  for var in $(compgen -e | grep -E '^(OMP_|DISTJAX_)' || true); do
    exports+=(-x "$var")
  done
  ip netns list | grep -q "^$LAUNCHER\b" || die "no launch node: run 'bash scripts/hosts.sh up N' first"
  exec ip netns exec "$LAUNCHER" mpirun --allow-run-as-root --oversubscribe -np "$ranks" --host "$hostlist" \
    --mca plm_rsh_agent "$SELF agent" \
    --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
    --mca odls_base_sigkill_timeout 2 --mca oob_tcp_keepalive_time 10 \
    --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 \
    "${exports[@]}" "$@"
}

# The namespace of host I, checked.
host_ns() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] || die "expected a host number, got '${1:-}'"
  hosts | grep -qx "$PREFIX$1" || die "no host $1 (hosts: $(hosts | tr '\n' ' '))"
  echo "$PREFIX$1"
}

kill_host() {
  local ns pid
  ns=$(host_ns "$1")
  for pid in $(ip netns pids "$ns"); do
    case "$(cat "/proc/$pid/comm" 2>/dev/null)" in
      orted | sh | "") ;;
      *) kill -9 "$pid" 2>/dev/null || true ;;
    esac
  done
}

slow_host() {
  local ns rate=${2:-}
  ns=$(host_ns "$1")
  [ -n "$rate" ] || die "slow takes a host and a rate (e.g. 30mbit) or off"
  tc qdisc del dev "dj-veth$1" root 2>/dev/null || true
  ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  [ "$rate" = off ] && return
  # Both directions: into the host (the bridge's end) and out of it (the host's end).
  tc qdisc add dev "dj-veth$1" root tbf rate "$rate" burst 64kb latency 1s ||
    die "cannot shape dj-veth$1 (tc tbf)"
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 1s
}

command=${1:-}
shift || true
case "$command" in
  up)
    exec 9>"$LOCK"
    flock 9
    up "${1:-}"
    ;;
  down)
    exec 9>"$LOCK"
    flock 9
    down
    ;;
  list) list ;;
  agent) agent "$@" ;;
  mpirun) run_mpi "$@" ;;
  kill) kill_host "${1:-}" ;;
  cut)
    host_ns "${1:-}" >/dev/null
    ip link set "dj-veth$1" down
    ;;
  slow) slow_host "${1:-}" "${2:-}" ;;
  *) die "usage: hosts.sh up N | down | list | mpirun [--on I,J] RANKS_PER_HOST PROGRAM [ARGS...] | kill I | cut I | slow I RATE|off" ;;
esac
