#!/usr/bin/env bash
# A test bed of K hosts on this machine, made of Linux namespaces (needs root):
#   scripts/hosts.sh up K          make hosts smddp-h1..smddp-hK (10.77.0.1..K), print their names
#   scripts/hosts.sh down          kill every process on them and remove them (idempotent)
#   scripts/hosts.sh exec HOST CMD [ARG...]   run CMD on HOST (a name or an address)
#   scripts/hosts.sh agent HOST CMD-LINE      the same for mpirun's remote-shell agent: the
#                                  command arrives as one shell line, as ssh would pass it
#   scripts/hosts.sh list          the hosts that are up, one "NAME ADDRESS PID" per line
# Each host has its own network namespace (an interface eth0 with its address, joined to the
# other hosts by a bridge in a namespace of its own, with no uplink and no route out), its own
# mount namespace (private /dev/shm and /tmp, an /etc/hosts naming every host) and its own host
# name. mpirun reaches them through `--mca plm_rsh_agent "scripts/hosts.sh agent"`, so
# `smddprun -H smddp-h1,smddp-h2` and --hostfile run unchanged.
# This checkout, and the folders in SMDDP_HOSTS_SHARE (colon-separated), stay visible on every
# host even when they lie under /tmp or /dev/shm.
# SMDDP_HOSTS_PREFIX (default smddp) and SMDDP_HOSTS_NET (default 10.77.0) name another bed.
set -euo pipefail
prefix="${SMDDP_HOSTS_PREFIX:-smddp}"
net="${SMDDP_HOSTS_NET:-10.77.0}"
state="/run/${prefix}-hosts"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
restore=""
switch="${prefix}-sw"

die() { echo "hosts.sh: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network, mount and UTS namespaces); run it as root"
  command -v ip >/dev/null || die "needs 'ip' (Debian package iproute2)"
  command -v nsenter >/dev/null && command -v unshare >/dev/null || die "needs nsenter and unshare (util-linux)"
}

# NAME -> the pid that holds its namespaces; NAME may be a host name or its address.
holder_of() {
  local want="$1" name addr pid
  [ -f "$state/hosts" ] || die "no hosts are up (scripts/hosts.sh up K)"
  while read -r name addr pid; do
    if [ "$want" = "$name" ] || [ "$want" = "$addr" ]; then
      [ -d "/proc/$pid" ] || die "host $name is down (its namespace holder $pid is gone)"
      echo "$pid"
      return
    fi
  done < "$state/hosts"
  die "no host named '$want' (up: $(cut -d' ' -f1 "$state/hosts" | tr '\n' ' '))"
}

down() {
  need_root
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-(h[0-9]+|sw)$" || true); do
    # Everything started on the host, however it got there, lives in its network namespace.
    for _ in 1 2 3; do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [ -z "$pids" ] && break
      kill -9 $pids 2>/dev/null || true
      sleep 0.2
    done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$state"
}

up() {
  need_root
  local k="$1" i name addr
  [[ "$k" =~ ^[1-9][0-9]?$ ]] && [ "$k" -le 50 ] || die "up takes a host count from 1 to 50, got '$k'"
  down
  mkdir -p "$state"
  trap 'down; exit 1' ERR
  ip netns add "$switch"
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  {
    echo "127.0.0.1 localhost"
    for i in $(seq 1 "$k"); do echo "$net.$i ${prefix}-h$i"; done
  } > "$state/etc-hosts"
  : > "$state/hosts.new"
  for i in $(seq 1 "$k"); do
    name="${prefix}-h$i"
    addr="$net.$i"
    ip netns add "$name"
    ip link add "h$i" netns "$switch" type veth peer name eth0 netns "$name"
    ip -n "$switch" link set "h$i" master br0 up
    ip -n "$name" link set lo up
    ip -n "$name" addr add "$addr/24" dev eth0
    ip -n "$name" link set eth0 up
    # The holder keeps the host's mount and UTS namespaces alive; `exec` enters them by its pid.
    # Folders every host must see (this checkout, SMDDP_HOSTS_SHARE) that live under the private
    # /tmp or /dev/shm are bound back in: parked on a mount point first, then moved into place.
    local keep="" path i_keep=0
    for path in "$repo" ${SMDDP_HOSTS_SHARE:+${SMDDP_HOSTS_SHARE//:/ }}; do
      case "$path" in
        /tmp/?*|/dev/shm/?*)
          keep+="mkdir -p '$state/keep.$i.$i_keep' && mount --bind '$path' '$state/keep.$i.$i_keep' && "
          restore+=" mkdir -p '$path' && mount --move '$state/keep.$i.$i_keep' '$path' &&"
          i_keep=$((i_keep + 1)) ;;
      esac
    done
    ip netns exec "$name" unshare --mount --uts --propagation private sh -c "$keep
      mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs /tmp && chmod 1777 /tmp /dev/shm &&$restore
      mount --bind '$state/etc-hosts' /etc/hosts && hostname '$name' && exec sleep infinity" \
      </dev/null >/dev/null 2>&1 &
    restore=""
    echo "$name $addr $!" >> "$state/hosts.new"
  done
  mv "$state/hosts.new" "$state/hosts"
  # Ready once every holder has set its host name (its mounts come before).
  for i in $(seq 1 "$k"); do
    name="${prefix}-h$i"
    local pid tries=0
    pid=$(holder_of "$name")
    until [ "$(nsenter -t "$pid" -u hostname 2>/dev/null)" = "$name" ]; do
      tries=$((tries + 1))
      [ "$tries" -lt 100 ] || die "host $name did not come up"
      sleep 0.05
    done
  done
  trap - ERR
  cut -d' ' -f1 "$state/hosts"
}

run_on() {
  local host="$1"
  shift
  local pid
  pid=$(holder_of "$host")
  exec nsenter -t "$pid" -n -m -u --wd="$PWD" -- "$@"
}

case "${1:-}" in
  up) [ $# -eq 2 ] || die "usage: hosts.sh up K"; up "$2" ;;
  down) down ;;
  list) [ -f "$state/hosts" ] && cat "$state/hosts" || true ;;
  exec) [ $# -ge 3 ] || die "usage: hosts.sh exec HOST CMD [ARG...]"; shift; run_on "$@" ;;
  # Open MPI calls `AGENT HOST orted ...` with the remote command in words meant for a shell.
  agent) [ $# -ge 3 ] || die "usage: hosts.sh agent HOST CMD-LINE"; host="$2"; shift 2; run_on "$host" /bin/sh -c "$*" ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
