#!/usr/bin/env bash
# Podman (Debian bookworm's 4.3.1) serving its Docker-compatible API on a
# socket of its own, rootful, beside the Docker engines. Its storage lives
# under /var/lib/polyarch/podman (graph root) and /run/polyarch/podman-run
# (run root) so it never touches the machine's own Podman or Docker state.
#
# Usage: podman.sh COMMAND
#   install   apt-get install podman when missing
#   start     install if needed, start `podman system service` (no-op when it
#             answers) and wait until /_ping answers; prints DOCKER_HOST
#   stop      stop the service this script started
#   host      print the DOCKER_HOST value
#   podman ARGS...  the podman CLI on the same storage (e.g. `run`, `images`)
#
# Paths: /run/polyarch/podman.sock (API), /run/polyarch/podman.pid,
# /var/log/polyarch/podman.log; /var/lib/polyarch/podman-{storage,registries}.conf
# (loopback registries are plain HTTP, as Docker treats them).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
unset DOCKER_HOST CONTAINER_HOST NOTIFY_SOCKET

run_dir=/run/polyarch
state_dir=/var/lib/polyarch
log_dir=/var/log/polyarch
sock="$run_dir/podman.sock"
pidfile="$run_dir/podman.pid"
lg="$log_dir/podman.log"
conf="$state_dir/podman-storage.conf"
regconf="$state_dir/podman-registries.conf"
wait_secs="${POLYARCH_PODMAN_WAIT:-60}"

log() { printf 'podman.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
need_root() { [[ $(id -u) -eq 0 ]] || die "$1 needs root"; }

write_conf() {
  mkdir -p "$state_dir/podman" "$run_dir/podman-run"
  cat >"$conf.tmp" <<CONF
[storage]
driver = "overlay"
graphroot = "$state_dir/podman"
runroot = "$run_dir/podman-run"
CONF
  mv -f "$conf.tmp" "$conf"
  # Docker treats loopback registries as plain HTTP; Podman needs telling (the tests'
  # registries listen on 127.0.0.1 without TLS).
  cat >"$regconf.tmp" <<CONF
unqualified-search-registries = []
[[registry]]
location = "127.0.0.1"
insecure = true
[[registry]]
location = "localhost"
insecure = true
CONF
  mv -f "$regconf.tmp" "$regconf"
}

# The podman CLI on this script's storage (and only that).
pm() { CONTAINERS_STORAGE_CONF="$conf" CONTAINERS_REGISTRIES_CONF="$regconf" podman --root "$state_dir/podman" --runroot "$run_dir/podman-run" "$@"; }

do_install() {
  command -v podman >/dev/null 2>&1 && return 0
  need_root install
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && die "podman not installed (POLYARCH_SKIP_INSTALL=1)"
  log "apt-get install podman"
  if ! apt-get -o DPkg::Lock::Timeout=300 install -y -qq podman </dev/null; then
    apt-get -o DPkg::Lock::Timeout=300 update -qq || log "apt-get update reported errors (continuing)"
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq podman </dev/null
  fi
}

answers() { [[ -S "$sock" ]] && [[ "$(curl -fsS --max-time 5 --unix-socket "$sock" http://d/_ping 2>/dev/null)" == OK ]]; }

service_pid() {
  local pid
  pid="$(cat "$pidfile" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "unix://$sock" || return 1
  printf '%s\n' "$pid"
}

do_start() {
  if answers; then printf 'unix://%s\n' "$sock"; return 0; fi
  need_root start
  do_install
  mkdir -p "$run_dir" "$log_dir"
  exec 8>"$run_dir/podman.lock"
  flock -w $((wait_secs + 60)) 8 || die "timed out waiting for $run_dir/podman.lock"
  if answers; then printf 'unix://%s\n' "$sock"; return 0; fi
  write_conf
  local pid deadline
  pid="$(service_pid || true)"
  if [[ -z "$pid" ]]; then
    rm -f "$sock"
    printf '\n==== %s podman system service\n' "$(date -Is)" >>"$lg"
    (
      cd /
      export CONTAINERS_STORAGE_CONF="$conf" CONTAINERS_REGISTRIES_CONF="$regconf"
      exec setsid podman --root "$state_dir/podman" --runroot "$run_dir/podman-run" \
        system service --time=0 "unix://$sock"
    ) >>"$lg" 2>&1 </dev/null 8>&- &
    pid=$!
    printf '%s\n' "$pid" >"$pidfile"
    log "starting podman system service (pid $pid, log $lg)"
  fi
  deadline=$((SECONDS + wait_secs))
  while ! answers; do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$lg" >&2; die "podman system service exited"; }
    ((SECONDS < deadline)) || { kill "$pid" 2>/dev/null; tail -n 20 "$lg" >&2; die "no answer within ${wait_secs}s"; }
    sleep 0.1 # poll interval
  done
  log "podman up: DOCKER_HOST=unix://$sock ($(podman --version))"
  printf 'unix://%s\n' "$sock"
}

do_stop() {
  need_root stop
  local pid i
  if pid="$(service_pid)"; then
    log "stopping podman system service $pid"
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  else
    log "podman system service is not running"
  fi
  rm -f "$pidfile" "$sock"
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  install) do_install ;;
  start) do_start ;;
  stop) do_stop ;;
  host) printf 'unix://%s\n' "$sock" ;;
  podman) [[ -f "$conf" ]] || write_conf; pm "$@" ;;
  *)
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" >&2
    exit 2
    ;;
esac
