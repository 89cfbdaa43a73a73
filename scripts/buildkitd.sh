#!/usr/bin/env bash
# A standalone BuildKit daemon for builds without a Docker engine: a unix socket
# and a TCP listener with mutual TLS, its own state. Debian bookworm, root.
# Binaries: BUILDKITD / BUILDCTL from the environment, else BuildKit v0.25.2
# built from Debian's archive by scripts/buildkit-debian.sh (cached outside the
# checkout: minutes the first time, nothing after); bookworm's runc is
# apt-get installed when it is missing.
#
# Usage: buildkitd.sh COMMAND
#   start   start buildkitd (no-op when it answers `buildctl debug workers`),
#           making the TLS certificates first; prints the unix BUILDKIT_HOST
#   stop    stop it (its state root is kept)
#   host    print the unix address (unix:///run/polyarch/buildkitd.sock)
#   tcp     print the TCP address (tcp://127.0.0.1:PORT, mutual TLS)
#   tls     print the client TLS directory (ca.pem, cert.pem, key.pem, as
#           `buildctl --tlsdir` reads it)
#
# Paths:
#   /run/polyarch/buildkitd.sock         unix socket (no TLS)
#   /run/polyarch/buildkitd.pid          pid of the daemon (written here)
#   /var/lib/polyarch/buildkitd/root     buildkitd --root
#   /var/lib/polyarch/buildkitd/tls      ca.pem ca.key (the CA), server.pem
#                                        server.key, cert.pem key.pem (client)
#   /var/log/polyarch/buildkitd.log      the daemon's output
#
# Knobs (environment):
#   POLYARCH_BUILDKITD_PORT=N   TCP port on 127.0.0.1 (default 21234)
#   POLYARCH_BUILDKITD_WAIT=S   how long `start` waits for the daemon (default 60)
#   BUILDKITD=PATH, BUILDCTL=PATH  the binaries (default: scripts/buildkit-debian.sh's)
#   POLYARCH_SKIP_INSTALL=1     fail instead of apt-get installing runc
#
# Concurrency: `start`/`stop` hold /run/polyarch/buildkitd.lock (flock); the
# lock fd is closed for the daemon so that it never holds the lock itself.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
unset BUILDKIT_HOST NOTIFY_SOCKET

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
run_dir=/run/polyarch
state_dir=/var/lib/polyarch/buildkitd
log_dir=/var/log/polyarch
sock="$run_dir/buildkitd.sock"
pidfile="$run_dir/buildkitd.pid"
tls_dir="$state_dir/tls"
port="${POLYARCH_BUILDKITD_PORT:-21234}"
wait_secs="${POLYARCH_BUILDKITD_WAIT:-60}"

log() { printf 'buildkitd: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
need_root() { [[ $(id -u) -eq 0 ]] || die "$1 needs root"; }

bin_of() { # bin_of VAR NAME -> the binary
  local v="${!1:-}" dir
  if [[ -n "$v" ]]; then
    [[ -x "$v" ]] || die "$1=$v is not an executable"
    printf '%s\n' "$v"
  else
    dir="$(bash "$here/buildkit-debian.sh" build)" || die "no $2: scripts/buildkit-debian.sh could not build it (or set $1)"
    printf '%s\n' "$dir/$2"
  fi
}

unix_host() { printf 'unix://%s\n' "$sock"; }
tcp_host() { printf 'tcp://127.0.0.1:%s\n' "$port"; }

answers() { # the daemon answers on its unix socket
  [[ -S "$sock" ]] || return 1
  timeout 10 "$buildctl" --addr "$(unix_host)" debug workers >/dev/null 2>&1
}

daemon_pid() { # pid from the pidfile, if alive and ours
  local pid
  pid="$(cat "$pidfile" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--root $state_dir/root" || return 1
  printf '%s\n' "$pid"
}

lock() { # holds fd 8 until the script exits
  mkdir -p "$run_dir"
  exec 8>"$run_dir/buildkitd.lock"
  flock -w $((wait_secs + 60)) 8 || die "timed out waiting for $run_dir/buildkitd.lock"
}

# CA, server certificate (SAN IP:127.0.0.1, localhost) and client certificate
# (clientAuth) made once; buildctl --tlsdir reads ca.pem, cert.pem, key.pem.
make_certs() {
  [[ -s "$tls_dir/ca.pem" && -s "$tls_dir/server.pem" && -s "$tls_dir/cert.pem" ]] && return 0
  command -v openssl >/dev/null 2>&1 || die "openssl missing (apt-get install openssl)"
  local t
  t="$(mktemp -d "$state_dir/tls.new.XXXXXX")"
  (
    cd "$t"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=polyarch-buildkitd-ca \
      -keyout ca.key -out ca.pem 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout server.key -out server.csr 2>/dev/null
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl req -newkey rsa:2048 -nodes -subj /CN=polyarch-client -keyout key.pem -out client.csr 2>/dev/null
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile client.ext -out cert.pem 2>/dev/null
    rm -f ./*.csr ./*.ext ./*.srl
    chmod 600 ./*.key key.pem
  ) || { rm -rf "$t"; die "openssl could not make the certificates"; }
  rm -rf "$tls_dir"
  mv "$t" "$tls_dir"
  log "certificates in $tls_dir"
}

ensure_runc() {
  command -v runc >/dev/null 2>&1 && runc --version >/dev/null 2>&1 && return 0
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && die "runc missing (POLYARCH_SKIP_INSTALL=1; apt-get install runc)"
  log "apt-get install runc"
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends runc </dev/null ||
    { apt-get -o DPkg::Lock::Timeout=300 update -qq || true
      apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends runc </dev/null; }
}

kill_daemon() { # TERM, bounded wait, then KILL
  local pid="$1" i
  kill "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 200; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  log "buildkitd $pid ignored SIGTERM for 20s; SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
}

do_start() {
  local pid lg deadline args
  buildkitd="$(bin_of BUILDKITD buildkitd)"
  if answers; then unix_host; return 0; fi
  need_root start
  lock
  if answers; then unix_host; return 0; fi # started while we waited
  ensure_runc
  mkdir -p "$run_dir" "$state_dir/root" "$log_dir"
  make_certs
  lg="$log_dir/buildkitd.log"
  pid="$(daemon_pid || true)"
  if [[ -z "$pid" ]]; then
    rm -f "$sock"
    if [[ -f "$lg" && $(stat -c %s "$lg") -gt 10000000 ]]; then mv -f "$lg" "$lg.1"; fi
    args=(
      --root "$state_dir/root"
      --addr "$(unix_host)"
      --addr "$(tcp_host)"
      --tlscacert "$tls_dir/ca.pem" --tlscert "$tls_dir/server.pem" --tlskey "$tls_dir/server.key"
      --oci-worker=true --containerd-worker=false
    )
    printf '\n==== %s buildkitd %s\n' "$(date -Is)" "${args[*]}" >>"$lg"
    # Own session, output to the log, stdin from /dev/null, the lock fd closed:
    # the daemon outlives this script and holds none of the caller's pipes.
    (cd / && exec setsid "$buildkitd" "${args[@]}") >>"$lg" 2>&1 </dev/null 8>&- &
    pid=$!
    printf '%s\n' "$pid" >"$pidfile"
    log "starting buildkitd (pid $pid, log $lg)"
  else
    log "buildkitd $pid is running but does not answer yet; waiting"
  fi
  deadline=$((SECONDS + wait_secs))
  while ! answers; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "buildkitd exited before answering; last lines of $lg:"
      tail -n 25 "$lg" >&2 || true
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      log "buildkitd did not answer within ${wait_secs}s; stopping it"
      kill_daemon "$pid"
      tail -n 25 "$lg" >&2 || true
      exit 1
    fi
    sleep 0.1 # poll interval
  done
  log "up: $(unix_host) and $(tcp_host) (mutual TLS, client files in $tls_dir)"
  unix_host
}

do_stop() {
  local pid
  need_root stop
  lock
  if pid="$(daemon_pid)"; then
    log "stopping buildkitd $pid"
    kill_daemon "$pid"
  else
    log "buildkitd is not running"
  fi
  rm -f "$pidfile"
}

cmd="${1:-}"
case "$cmd" in
  start) buildctl="$(bin_of BUILDCTL buildctl)"; do_start ;;
  stop) do_stop ;;
  host) unix_host ;;
  tcp) tcp_host ;;
  tls) printf '%s\n' "$tls_dir" ;;
  *)
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" >&2
    [[ -z "$cmd" || "$cmd" == -h || "$cmd" == --help || "$cmd" == help ]] || die "unknown command '$cmd'"
    exit 2
    ;;
esac
