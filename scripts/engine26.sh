#!/usr/bin/env bash
# A current Docker Engine (26.1, API 1.45, containerd 1.7, buildx 0.13.1)
# beside the machine's own engine, for tests that need a containerd image store.
# Debian bookworm, root. Nothing but Debian's package archive is downloaded:
# trixie's docker.io, docker-cli, containerd and docker-buildx are fetched with
# a private apt state (the host's apt lists and dpkg database stay untouched)
# and unpacked with `dpkg-deb -x` into a private prefix. The machine's engine
# (/var/run/docker.sock, /etc/docker/daemon.json) is never touched.
#
# POLYARCH_DOCKER_SERIES=28 (or scripts/engine28.sh) does the same for Docker
# 28.5 (API 1.51, containerd 2.1, buildx 0.29.1) from Debian sid: prefix
# /opt/polyarch/docker28, names docker28-STORE, bridges pa28-containerd
# (198.18.228.1/24) and pa28-classic (198.18.229.1/24), knobs
# POLYARCH_DOCKER28_*; both series run side by side.
#
# Usage: engine26.sh COMMAND [STORE]      STORE: containerd (default) | classic
#   install          unpack the engine into the prefix (no-op when the stamp
#                    matches); apt-get installs bookworm's runc and tini only
#                    when they are missing
#   start [STORE]    install if needed, start dockerd 26.1 for STORE (no-op when
#                    it answers) and wait until `docker info` answers; prints
#                    the DOCKER_HOST value on stdout
#   stop [STORE|all] stop that engine, remove its bridge (data root is kept)
#   host [STORE]     print the DOCKER_HOST value
#   bin              print the directory holding the 26.1 `docker` CLI
#   docker-config    print a private DOCKER_CONFIG directory with buildx at
#                    cli-plugins/docker-buildx (~/.docker is never used)
#   env [STORE]      print `export DOCKER_HOST=… DOCKER_CONFIG=… PATH=…` lines
#
# The stores: `containerd` runs with features.containerd-snapshotter (image
# store in containerd, overlayfs snapshotter, multi-platform images);
# `classic` is the same engine with the graph-driver store (dockerd picks the
# first driver that works, overlay2 on ext4; POLYARCH_DOCKER26_STORAGE_DRIVER
# forces one). Both run at the same time, each with its own socket, data
# root, exec root, pidfile, containerd (namespaces), config file and default
# bridge. No iptables rules, ip_forward left alone: containers on the default
# network reach the host but nothing beyond; `none` and `host` work as usual.
#
# Why not `--bridge none`: dockerd then deletes the interface `docker0` at
# start-up (moby's removeDefaultBridgeInterface), which is the machine's
# engine's bridge. Each store gets its own bridge instead, made here when
# missing: pa26-containerd (198.18.226.1/24), pa26-classic (198.18.227.1/24),
# addresses from the benchmarking range (198.18.0.0/15), outside Docker's
# default address pools.
#
# Paths (STORE = containerd | classic):
#   PREFIX/usr/{bin,sbin}/...            docker, dockerd, containerd, shims
#   PREFIX/docker-config/                DOCKER_CONFIG with cli-plugins/docker-buildx
#   /run/polyarch/docker26-STORE.sock    API socket (DOCKER_HOST=unix://…)
#   /run/polyarch/docker26-STORE.pid     pidfile; /run/polyarch/docker26-STORE/ exec root
#   /var/lib/polyarch/docker26-STORE/    data root; docker26-STORE.json its config file
#   /var/log/polyarch/docker26-STORE.log dockerd's output
#
# Knobs (environment):
#   POLYARCH_DOCKER26_PREFIX=DIR   install prefix (default /opt/polyarch/docker26)
#   POLYARCH_DOCKER26_WAIT=SECS    how long `start` waits for the engine (default 90)
#   POLYARCH_DOCKER26_MIRROR=URL   Debian archive to fetch trixie from (default:
#                                  the host's bookworm source, else Debian's CDN)
#   POLYARCH_DOCKER26_STORAGE_DRIVER=NAME  classic store's graph driver (default: auto)
#   POLYARCH_DOCKER26_BIP_CONTAINERD=CIDR, POLYARCH_DOCKER26_BIP_CLASSIC=CIDR
#                                  the bridges' addresses (defaults above)
#   POLYARCH_SKIP_INSTALL=1        fail instead of downloading/apt-get installing
#
# Concurrency: `install` holds PREFIX.lock, `start`/`stop` hold
# /run/polyarch/docker26-STORE.lock (flock), so parallel test processes may call
# `start` at the same time.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
# The caller's client settings must not leak into dockerd (it reads
# DOCKER_TLS_VERIFY / DOCKER_CERT_PATH) nor into our own `docker info` probes.
unset DOCKER_HOST DOCKER_CONTEXT DOCKER_TLS_VERIFY DOCKER_CERT_PATH DOCKER_CONFIG NOTIFY_SOCKET

# The series: 26 (trixie's 26.1) or 28 (sid's 28.5, containerd 2.1, buildx
# 0.29). Everything of one series (prefix, sockets, data roots, bridges) is
# named after it, so both run side by side.
series="${POLYARCH_DOCKER_SERIES:-26}"
case "$series" in
  26) suite=trixie expect_version="26.1." bip_c=198.18.226.1/24 bip_k=198.18.227.1/24 ;;
  28) suite=sid expect_version="28.5." bip_c=198.18.228.1/24 bip_k=198.18.229.1/24 ;;
  *) printf 'engine%s: ERROR: POLYARCH_DOCKER_SERIES must be 26 or 28\n' "$series" >&2; exit 2 ;;
esac
name="docker$series"
prefix_var="POLYARCH_DOCKER${series}_PREFIX" wait_var="POLYARCH_DOCKER${series}_WAIT"
prefix="${!prefix_var:-/opt/polyarch/$name}"
prefix="${prefix%/}"
run_dir=/run/polyarch
state_dir=/var/lib/polyarch
log_dir=/var/log/polyarch
wait_secs="${!wait_var:-90}"
pkgs=(docker.io docker-cli containerd docker-buildx)
# Bump when the prefix layout or the way it is made changes: forces a reinstall.
layout=1
stamp="$prefix/.polyarch-$name"

# knob NAME DEFAULT : $POLYARCH_DOCKER<series>_NAME, else DEFAULT
knob() { local v="POLYARCH_DOCKER${series}_$1"; printf '%s\n' "${!v:-$2}"; }
log() { printf 'engine%s: %s\n' "$series" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
need_root() { [[ $(id -u) -eq 0 ]] || die "$1 needs root"; }

store_of() { # store_of [STORE] -> validated store name
  local s="${1:-containerd}"
  case "$s" in
    containerd | classic) printf '%s\n' "$s" ;;
    *) die "unknown store '$s' (containerd or classic)" ;;
  esac
}
sock_of() { printf '%s/%s-%s.sock\n' "$run_dir" "$name" "$1"; }
host_of() { printf 'unix://%s\n' "$(sock_of "$1")"; }
pidfile_of() { printf '%s/%s-%s.pid\n' "$run_dir" "$name" "$1"; }
log_of() { printf '%s/%s-%s.log\n' "$log_dir" "$name" "$1"; }
bridge_of() { printf 'pa%s-%s\n' "$series" "$1"; } # at most 15 characters
bip_of() {
  case "$1" in
    containerd) printf '%s\n' "$(knob BIP_CONTAINERD "$bip_c")" ;;
    classic) printf '%s\n' "$(knob BIP_CLASSIC "$bip_k")" ;;
  esac
}

# ------------------------------------------------------------------ install

runc_ok() { command -v runc >/dev/null 2>&1 && runc --version >/dev/null 2>&1; }
tini_ok() { [[ -x /usr/bin/tini-static ]]; }

installed() {
  [[ -f "$stamp" && "$(head -n 1 "$stamp")" == "layout=$layout" ]] || return 1
  local f
  for f in usr/sbin/dockerd usr/bin/docker usr/bin/containerd \
    usr/bin/containerd-shim-runc-v2 usr/bin/docker-init \
    docker-config/cli-plugins/docker-buildx; do
    [[ -x "$prefix/$f" ]] || return 1
  done
  runc_ok && tini_ok
}

apt_install_host() { # apt_install_host PKG... (bookworm packages for the host)
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && die "missing host packages: $* (POLYARCH_SKIP_INSTALL=1)"
  log "apt-get install $*"
  if ! apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$@" </dev/null; then
    log "apt-get install failed; apt-get update and retry"
    # Unreachable third-party sources make update exit non-zero; the install decides.
    apt-get -o DPkg::Lock::Timeout=300 update -qq || log "apt-get update reported errors (continuing)"
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$@" </dev/null
  fi
}

# shellcheck source=debian-mirror.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

do_install() {
  if installed; then return 0; fi
  need_root install
  mkdir -p "$(dirname "$prefix")"
  exec 9>"$prefix.lock"
  flock -w 900 9 || die "timed out waiting for $prefix.lock"
  if installed; then exec 9>&-; return 0; fi # another process finished it
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && die "Docker $expect_version not installed in $prefix (POLYARCH_SKIP_INSTALL=1)"
  local t0=$SECONDS

  # bookworm's runc (trixie's needs glibc 2.38) and tini-static as docker-init
  local host_pkgs=()
  runc_ok || host_pkgs+=(runc)
  tini_ok || host_pkgs+=(tini)
  [[ ${#host_pkgs[@]} -eq 0 ]] || apt_install_host "${host_pkgs[@]}"
  runc_ok || die "runc still missing or not working"
  tini_ok || die "/usr/bin/tini-static still missing"

  local tmp arch mirror keyring opts=()
  tmp="$(mktemp -d /var/tmp/polyarch-$name.XXXXXX)"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp' '$prefix.new.$$'" EXIT
  arch="$(dpkg --print-architecture)"
  mirror="$(debian_mirror "$(knob MIRROR "")")"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/debs"
  {
    printf 'deb [arch=%s target=Packages' "$arch"
    [[ -f "$keyring" ]] && printf ' signed-by=%s' "$keyring"
    printf '] %s %s main\n' "$mirror" "$suite"
  } >"$tmp/sources.list"
  # apt downloads as user _apt; let it write (no "unsandboxed" warnings).
  if id _apt >/dev/null 2>&1; then chown -R _apt "$tmp"; fi
  opts=(
    -o "Dir::Etc::SourceList=$tmp/sources.list"
    -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$tmp/lists"
    -o "Dir::Cache=$tmp/cache"
  )
  log "fetching ${pkgs[*]} from $suite ($mirror) into a private apt state"
  apt-get "${opts[@]}" update -qq </dev/null || die "apt-get update of the private $suite list failed"
  local dl=()
  for p in "${pkgs[@]}"; do dl+=("$p/$suite"); done
  (cd "$tmp/debs" && apt-get "${opts[@]}" download -qq "${dl[@]}" </dev/null) ||
    die "apt-get download ${dl[*]} failed"

  local stage="$prefix.new.$$" deb versions=()
  rm -rf "$stage"
  mkdir -p "$stage"
  for deb in "$tmp"/debs/*.deb; do
    dpkg-deb -x "$deb" "$stage"
    versions+=("$(dpkg-deb -f "$deb" Package)=$(dpkg-deb -f "$deb" Version)")
  done
  # trixie's runc (if any) needs glibc 2.38: use bookworm's from PATH instead.
  rm -f "$stage/usr/bin/runc" "$stage/usr/sbin/runc"
  # docker-init is a link to tini-static of trixie's tini (not fetched).
  ln -sfn /usr/bin/tini-static "$stage/usr/bin/docker-init"
  mkdir -p "$stage/docker-config/cli-plugins"
  ln "$stage/usr/libexec/docker/cli-plugins/docker-buildx" "$stage/docker-config/cli-plugins/docker-buildx" 2>/dev/null ||
    cp "$stage/usr/libexec/docker/cli-plugins/docker-buildx" "$stage/docker-config/cli-plugins/docker-buildx"
  printf '{}\n' >"$stage/docker-config/config.json"

  local dv bv cv
  dv="$("$stage/usr/sbin/dockerd" --version)" || die "unpacked dockerd does not run"
  [[ "$dv" == *"version $expect_version"* ]] || die "expected dockerd $expect_version*, got: $dv"
  "$stage/usr/bin/docker" --version >/dev/null || die "unpacked docker CLI does not run"
  cv="$("$stage/usr/bin/containerd" --version)" || die "unpacked containerd does not run"
  bv="$("$stage/docker-config/cli-plugins/docker-buildx" version)" || die "unpacked buildx does not run"
  {
    printf 'layout=%s\n' "$layout"
    printf '%s\n' "${versions[@]}"
    printf '# %s\n# %s\n# %s\n' "$dv" "$cv" "$bv"
  } >"$stage/.polyarch-$name"

  if [[ -e "$prefix" ]]; then
    mv "$prefix" "$prefix.old.$$"
    mv "$stage" "$prefix"
    rm -rf "$prefix.old.$$"
  else
    mv "$stage" "$prefix"
  fi
  rm -rf "$tmp"
  trap - EXIT
  exec 9>&-
  log "installed into $prefix in $((SECONDS - t0))s: ${versions[*]}"
}

# ------------------------------------------------------------------ engines

docker26() { # docker26 STORE ARGS... : the 26.1 CLI against that store's engine
  local s="$1"
  shift
  DOCKER_HOST="$(host_of "$s")" DOCKER_CONFIG="$prefix/docker-config" "$prefix/usr/bin/docker" "$@"
}

answers() { # answers STORE : the engine answers `docker info`
  local v
  [[ -S "$(sock_of "$1")" && -x "$prefix/usr/bin/docker" ]] || return 1
  v="$(timeout 10 env DOCKER_HOST="$(host_of "$1")" DOCKER_CONFIG="$prefix/docker-config" \
    "$prefix/usr/bin/docker" info --format '{{.ServerVersion}}' 2>/dev/null)" || return 1
  [[ -n "$v" ]]
}

# pid of this store's dockerd from its pidfile, if that process is alive and is ours
engine_pid() {
  local pf pid
  pf="$(pidfile_of "$1")"
  [[ -f "$pf" ]] || return 1
  pid="$(cat "$pf" 2>/dev/null)" || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "--pidfile $pf" || return 1
  printf '%s\n' "$pid"
}

lock_store() { # holds fd 8 until the script exits
  mkdir -p "$run_dir"
  exec 8>"$run_dir/$name-$1.lock"
  flock -w $((wait_secs + 120)) 8 || die "timed out waiting for $run_dir/$name-$1.lock"
}

write_config() { # write_config STORE FILE
  local snap=false
  [[ "$1" == containerd ]] && snap=true
  {
    printf '{\n  "features": {"containerd-snapshotter": %s}' "$snap"
    if [[ "$1" == classic && -n "$(knob STORAGE_DRIVER "")" ]]; then
      printf ',\n  "storage-driver": "%s"' "$(knob STORAGE_DRIVER "")"
    fi
    printf '\n}\n'
  } >"$2.tmp"
  mv -f "$2.tmp" "$2"
}

# The store's own bridge (dockerd uses but never creates a non-default one).
ensure_bridge() { # ensure_bridge STORE
  local br bip other
  br="$(bridge_of "$1")" bip="$(bip_of "$1")"
  command -v ip >/dev/null 2>&1 || apt_install_host iproute2
  if ip link show dev "$br" >/dev/null 2>&1; then
    # dockerd takes the address from the bridge (--bip and -b exclude each other)
    [[ -n "$(ip -4 -o addr show dev "$br")" ]] && return 0
  else
    other="$(ip -4 route show to match "${bip%/*}" | grep -v '^default' || true)"
    [[ -z "$other" ]] || die "the bridge address $bip of $br overlaps a route: $other (set POLYARCH_DOCKER${series}_BIP_${1^^})"
    log "creating bridge $br with $bip"
    ip link add name "$br" type bridge
  fi
  ip addr add "$bip" dev "$br"
}

show_log() {
  log "last lines of $(log_of "$1"):"
  tail -n 25 "$(log_of "$1")" >&2 || true
}

kill_engine() { # kill_engine PID : TERM, bounded wait, then KILL
  local pid="$1" i
  kill "$pid" 2>/dev/null || return 0
  for ((i = 0; i < 300; i++)); do # dockerd gives containers 15 s to stop
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  log "dockerd $pid ignored SIGTERM for 30s; SIGKILL"
  kill -9 "$pid" 2>/dev/null || true
}

do_start() {
  local s="$1" pid cfg lg i deadline args
  if installed && answers "$s"; then host_of "$s"; return 0; fi
  need_root start
  do_install
  lock_store "$s"
  if answers "$s"; then host_of "$s"; return 0; fi # started while we waited
  mkdir -p "$run_dir" "$state_dir" "$log_dir"
  lg="$(log_of "$s")"
  pid="$(engine_pid "$s" || true)"
  if [[ -z "$pid" ]]; then
    rm -f "$(pidfile_of "$s")"
    cfg="$state_dir/$name-$s.json"
    write_config "$s" "$cfg"
    ensure_bridge "$s"
    if [[ -f "$lg" && $(stat -c %s "$lg") -gt 10000000 ]]; then mv -f "$lg" "$lg.1"; fi
    args=(
      --config-file "$cfg"
      --host "$(host_of "$s")"
      --data-root "$state_dir/$name-$s"
      --exec-root "$run_dir/$name-$s"
      --pidfile "$(pidfile_of "$s")"
      --containerd-namespace "polyarch-$name-$s"
      --containerd-plugins-namespace "polyarch-$name-$s-plugins"
      --init-path "$prefix/usr/bin/docker-init"
      --bridge "$(bridge_of "$s")"
      --iptables=false --ip6tables=false --ip-forward=false
    )
    printf '\n==== %s dockerd %s\n' "$(date -Is)" "${args[*]}" >>"$lg"
    # Own session, output to the log, stdin from /dev/null, lock fds closed:
    # the engine outlives this script and holds none of the caller's pipes.
    (
      cd /
      export PATH="$prefix/usr/bin:$prefix/usr/sbin:$PATH"
      exec setsid "$prefix/usr/sbin/dockerd" "${args[@]}"
    ) >>"$lg" 2>&1 </dev/null 8>&- 9>&- &
    pid=$!
    log "starting dockerd $expect_version ($s store, pid $pid, log $lg)"
  else
    log "dockerd $pid ($s store) is running but does not answer yet; waiting"
  fi
  deadline=$((SECONDS + wait_secs))
  while ! answers "$s"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "dockerd ($s store) exited before answering"
      show_log "$s"
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      log "dockerd ($s store) did not answer within ${wait_secs}s; stopping it"
      kill_engine "$pid"
      show_log "$s"
      exit 1
    fi
    sleep 0.1 # poll interval
  done
  log "$name-$s up: DOCKER_HOST=$(host_of "$s") ($(docker26 "$s" info --format '{{.ServerVersion}}, {{.Driver}}'))"
  host_of "$s"
}

do_stop() {
  local s="$1" pid i cpid
  need_root stop
  lock_store "$s"
  if pid="$(engine_pid "$s")"; then
    log "stopping dockerd $pid ($s store)"
    kill_engine "$pid"
  else
    log "$name-$s is not running"
  fi
  # A dockerd that was SIGKILLed leaves its managed containerd behind.
  cpid="$(cat "$run_dir/$name-$s/containerd/containerd.pid" 2>/dev/null || true)"
  if [[ "$cpid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$cpid/cmdline" 2>/dev/null |
    grep -qF "$run_dir/$name-$s/containerd/"; then
    log "stopping leftover containerd $cpid"
    kill "$cpid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$(pidfile_of "$s")"
  # dockerd bind-mounts its data root onto itself (shared propagation) and
  # does not always undo it; unmount so that the directory can be removed.
  if mountpoint -q "$state_dir/$name-$s" 2>/dev/null; then
    umount "$state_dir/$name-$s" || log "could not unmount $state_dir/$name-$s"
  fi
  if command -v ip >/dev/null 2>&1 && ip link show dev "$(bridge_of "$s")" >/dev/null 2>&1; then
    ip link del dev "$(bridge_of "$s")" || log "could not delete bridge $(bridge_of "$s")"
  fi
}

# ------------------------------------------------------------------ main

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
store="${1:-containerd}"
case "$cmd" in
  start | stop | host | env)
    # (not `$(store_of …)` as an argument: a failure there would not stop us)
    if [[ "$cmd" != stop || "$store" != all ]]; then store="$(store_of "$store")"; fi
    ;;
esac
case "$cmd" in
  install) do_install ;;
  start) do_start "$store" ;;
  stop)
    if [[ "$store" == all ]]; then
      (do_stop containerd)
      (do_stop classic)
    else
      do_stop "$store"
    fi
    ;;
  host) host_of "$store" ;;
  bin) printf '%s\n' "$prefix/usr/bin" ;;
  docker-config) printf '%s\n' "$prefix/docker-config" ;;
  env)
    printf 'export DOCKER_HOST=%q\n' "$(host_of "$store")"
    printf 'export DOCKER_CONFIG=%q\n' "$prefix/docker-config"
    printf 'export PATH=%q:"$PATH"\n' "$prefix/usr/bin"
    ;;
  *)
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" >&2
    [[ -z "$cmd" || "$cmd" == -h || "$cmd" == --help || "$cmd" == help ]] || die "unknown command '$cmd'"
    exit 2
    ;;
esac
