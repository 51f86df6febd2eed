#!/usr/bin/env bash
# `make fresh-check`: the README's two commands on a clean Debian root, as a new user
# on a freshly provisioned machine would type them. The suite is Debian 12 "bookworm"
# unless SUITE names another (`make fresh-check SUITE=trixie`, or SUITE=trixie in the
# environment of this script): bookworm and trixie are the two the README promises.
#
#   1. bootstrap  debootstrap --variant=minbase $SUITE from the archive this machine's apt
#                 uses, with the host's apt sources switched to $SUITE; the root is cached
#                 as a tarball per suite outside the repository
#                 (${DISTJAX_FRESH_CACHE:-~/.cache/distjax-fresh-check}), so later runs skip it
#   2. unpack     the cached root into a temporary directory
#   3. copy tree  `git archive HEAD`: the committed tree only (nothing untracked, no build
#                 directory, no ccache)
#   4. mount      /proc, /sys, /dev, /dev/pts, /dev/shm
#   5. test       `bash scripts/test.sh` inside the root, as root, with a clean environment
#   6. pip        `pip install .` into a fresh virtual environment, then `import distjax` from
#                 outside the tree: a NumPy array shared without a copy, a shard_map
#   7. run        `bash scripts/run.sh`
#
# Prints one line per step with its time and ends with PASS or FAIL naming the step.
# Always unmounts and removes the temporary root, also on failure or Ctrl-C.
# Needs root (debootstrap, mount, chroot). Options: --keep (leave the root for inspection,
# still unmounted), --rebuild-root (bootstrap again even if the tarball exists).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

SUITE=${SUITE:-bookworm}
CACHE_DIR=${DISTJAX_FRESH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distjax-fresh-check}
TARBALL="$CACHE_DIR/debian-$SUITE-minbase-$(dpkg --print-architecture).tar.gz"
KEEP=0
REBUILD=0
for arg in "$@"; do
  case "$arg" in
    --keep) KEEP=1 ;;
    --rebuild-root) REBUILD=1 ;;
    *) echo "fresh-check: unknown argument '$arg' (expected --keep or --rebuild-root)" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-check: needs root (debootstrap, mount and chroot); run it with sudo" >&2
  exit 2
fi

WORK=$(mktemp -d /var/tmp/distjax-fresh.XXXXXX)
ROOT="$WORK/root"
LOG="$WORK/step.log"
STEP="setup"
CHILD=""
T_ALL=$(date +%s)

# ------------------------------------------------------------------ cleanup, always
unmount_all() {
  # Processes still running inside the root (an orphaned mpirun, say) keep mounts busy.
  local pid
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$ROOT" ] && kill -9 "$pid" 2>/dev/null || true
  done
  # Deepest mount points first.
  local m
  for m in $(findmnt -rn -o TARGET | grep -F "$ROOT/" | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  [ -n "${CHILD:-}" ] && kill "$CHILD" 2>/dev/null || true
  unmount_all
  if findmnt -rn -o TARGET | grep -qF "$ROOT/"; then
    # Never rm -rf over a still-mounted /dev or /sys.
    echo "fresh-check: could not unmount everything under $ROOT; left it in place" >&2
  elif [ "$KEEP" -eq 1 ]; then
    echo "fresh-check: root kept at $ROOT (unmounted)"
  else
    rm -rf --one-file-system "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'echo; echo "fresh-check: interrupted during step $STEP"; exit 130' INT TERM

fail() {
  local secs=$1
  printf 'FAIL  %-10s %5ds\n' "$STEP" "$secs"
  echo "---- last lines of $STEP ----"
  tail -n 60 "$LOG" || true
  echo "FAIL: fresh-check failed at step '$STEP' (total $(($(date +%s) - T_ALL))s)"
  exit 1
}

# Runs "$@" as step $1 (the rest is the command), output to $LOG, and prints the timing line.
step() {
  STEP=$1
  shift
  local t0
  t0=$(date +%s)
  : >"$LOG"
  # In the background and waited for, so that a signal runs the trap at once (bash defers
  # traps until a foreground child exits); the cleanup kills what runs inside the root.
  "$@" >>"$LOG" 2>&1 &
  CHILD=$!
  if wait "$CHILD"; then
    printf 'ok    %-10s %5ds\n' "$STEP" "$(($(date +%s) - t0))"
  else
    fail "$(($(date +%s) - t0))"
  fi
}

# ------------------------------------------------------------------ the steps
mirror() {
  # The first Debian archive the host's apt uses (deb822 or one-line format).
  local uri
  uri=$(grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' \
        | grep -vi security | head -n 1 || true)
  [ -n "$uri" ] || uri=$(grep -hE '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' \
        | grep -vi security | head -n 1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

bootstrap() {
  command -v debootstrap >/dev/null || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
  }
  mkdir -p "$CACHE_DIR"
  local tmp="$WORK/bootstrap"
  debootstrap --variant=minbase "$SUITE" "$tmp" "$(mirror)"
  # The host's apt sources and settings, as a freshly provisioned machine of this kind has them,
  # with the host's suite names (bookworm, bookworm-updates, bookworm-security) made $SUITE's.
  rm -f "$tmp/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/*.sources "$tmp/etc/apt/sources.list.d/" 2>/dev/null || true
  [ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$tmp/etc/apt/sources.list"
  local host_suite
  host_suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  if [ -n "$host_suite" ] && [ "$host_suite" != "$SUITE" ]; then
    local f
    for f in "$tmp/etc/apt/sources.list" "$tmp"/etc/apt/sources.list.d/*.sources; do
      if [ -f "$f" ]; then sed -i -E "s/\\b$host_suite(-updates|-security)?\\b/$SUITE\\1/g" "$f"; fi
    done
  fi
  cp /etc/apt/apt.conf.d/99* "$tmp/etc/apt/apt.conf.d/" 2>/dev/null || true
  rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*
  tar -C "$tmp" -czf "$TARBALL.part" .
  mv "$TARBALL.part" "$TARBALL"
  rm -rf --one-file-system "$tmp"
}

unpack() {
  mkdir -p "$ROOT"
  tar -C "$ROOT" -xzf "$TARBALL"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
}

copy_tree() {
  mkdir -p "$ROOT/root/distjax"
  git -C "$REPO" archive --format=tar HEAD | tar -C "$ROOT/root/distjax" -xf -
  # ../shared beside the checkout, as CI has it.
  if [ -d "$REPO/../shared" ]; then
    cp -a "$REPO/../shared" "$ROOT/root/shared"
  fi
}

mount_all() {
  mount -t proc proc "$ROOT/proc"
  mount -t sysfs sysfs "$ROOT/sys"
  mount --bind /dev "$ROOT/dev"
  mount -t devpts devpts "$ROOT/dev/pts" -o newinstance,ptmxmode=0666
  mount -t tmpfs shm "$ROOT/dev/shm" -o mode=1777
}

# pip inside the root (the test command's .venv-test) uses the host's pip settings: the CA
# bundle of this network (PIP_CERT, copied in) and its timeout, as a new machine here has.
PIP_ENV=()
copy_pip_settings() {
  if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
    cp "$PIP_CERT" "$ROOT/etc/distjax-pip-ca.crt"
    PIP_ENV+=(PIP_CERT=/etc/distjax-pip-ca.crt)
  fi
  [ -n "${PIP_DEFAULT_TIMEOUT:-}" ] && PIP_ENV+=("PIP_DEFAULT_TIMEOUT=$PIP_DEFAULT_TIMEOUT")
  return 0
}

in_root() {
  chroot "$ROOT" /usr/bin/env -i HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${PIP_ENV[@]}" \
    /bin/bash -c "cd /root/distjax && $1"
}

echo "fresh-check: Debian $SUITE minbase, commit $(git -C "$REPO" rev-parse --short HEAD), in $WORK"
if [ "$REBUILD" -eq 1 ] || [ ! -f "$TARBALL" ]; then
  step bootstrap bootstrap
else
  printf 'ok    %-10s %5ds  (cached %s)\n' bootstrap 0 "$TARBALL"
fi
step unpack unpack
step copy-tree copy_tree
step mount mount_all
copy_pip_settings  # sets PIP_ENV here (a step runs in a subshell)
step test in_root "bash scripts/test.sh"
# The Python package as a user installs it: `pip install .` into a fresh virtual environment
# (its own CMake build; the test build's objects come back from ccache), then imported from
# outside the source tree, a tensor shared with NumPy and a shard_map over 2 devices.
step pip in_root "python3 -m venv /tmp/distjax-venv && /tmp/distjax-venv/bin/pip install -q . &&
  cd / && OMP_WAIT_POLICY=passive /tmp/distjax-venv/bin/python -c '
import numpy as np, distjax as dj
a = np.arange(8, dtype=np.float32)
assert dj.asarray(a).data_ptr == a.ctypes.data
f = dj.shard_map(lambda x: dj.psum(dj.sum(x), \"data\"), dj.Mesh((2,), (\"data\",)), dj.P(\"data\"), dj.P())
assert f(a).gather().item() == 28.0
print(\"distjax\", dj.__file__, \"imports and runs\")'"
step run in_root "bash scripts/run.sh"
tail -n 3 "$LOG"
echo "PASS: the README's two commands pass on a clean Debian $SUITE root (total $(($(date +%s) - T_ALL))s)"
