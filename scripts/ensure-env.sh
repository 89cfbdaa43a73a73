#!/usr/bin/env bash
# Environment set-up, in two sizes:
#   ensure-env.sh demo   what `make demo` uses: the tools it runs (apt-get, only
#                        when a command is missing), a Docker engine answering
#                        `docker info` (dockerd started if not) and the busybox
#                        fixtures. No other engine or daemon is installed or started.
#   ensure-env.sh test   (the default; .ci/run and `make test`) all of the above,
#                        the tools the whole suite runs, and every engine it uses:
#                        Docker 26.1 and 28.5 (scripts/engine26.sh, engine28.sh),
#                        Podman 4.3 (scripts/podman.sh) and a standalone BuildKit
#                        daemon built from Debian's archive (scripts/buildkitd.sh),
#                        cosign 3.1.1 from Debian sid (scripts/cosign.sh),
#                        cargo-auditable and mdBook for `make docs`, both from
#                        crates.io (scripts/crate-tool.sh).
# Idempotent and cheap when everything is already there. Nothing outside the
# clone is needed: what is missing comes from Debian's archive, and a step that
# cannot be had stops the script with one line naming it.
#
# Knobs (environment):
#   POLYARCH_SKIP_INSTALL=1     do not apt-get anything
#   POLYARCH_SKIP_ENGINE=1      do not check/start dockerd
#   POLYARCH_SKIP_FIXTURES=1    do not fetch busybox
#   POLYARCH_SKIP_DOCKER26=1, POLYARCH_SKIP_DOCKER28=1, POLYARCH_SKIP_PODMAN=1,
#   POLYARCH_SKIP_BUILDKITD=1   (test) leave that engine out
#   POLYARCH_SKIP_MDBOOK=1      (test) do not build mdBook (`make docs` then builds it)
#   POLYARCH_DOCKERD_LOG=FILE   dockerd log (default /tmp/polyarch-dockerd.log)
#   POLYARCH_DOCKERD_ARGS=...   extra dockerd arguments (word-split)
#   POLYARCH_DOCKERD_WAIT=SECS  how long to wait for the engine (default 60)
#   DOCKER_HOST=unix:///path    also passed to dockerd as -H when set
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DEBIAN_FRONTEND=noninteractive

log() { printf 'ensure-env: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- 1. tools
mode="${1:-test}"
case "$mode" in
  demo | test) ;;
  *) die "unknown mode '$mode' (demo or test)" ;;
esac

# command -> Debian package that provides it
tools=(
  "docker:docker.io"
  "dockerd:docker.io"
  "docker-registry:docker-registry"
  "skopeo:skopeo"
  "qemu-aarch64-static:qemu-user-static"
  "curl:curl"
  "python3:python3"
  "flock:util-linux"
)
if [[ "$mode" == test ]]; then
  tools+=(
    "htpasswd:apache2-utils"
    "openssl:openssl"
    "objdump:binutils"
    "make:make"
    "ssh-agent:openssh-client"
    "ssh:openssh-client"
    # tests/remote_builders.rs: test hosts are network namespaces with their own sshd
    "sshd:openssh-server"
    "ssh-keygen:openssh-client"
    "ip:iproute2"
    "nsenter:util-linux"
    # tests/progress.rs gives polyarch a terminal with script(1)
    "script:bsdutils"
    # action.yml's scripts/action-run.sh reads the record's digests (tests/action.rs)
    "jq:jq"
    # tests/hostile_registry.rs measures each run's peak memory with GNU time's %M
    "/usr/bin/time:time"
    # tests/sbom.rs checks the SBOMs against the real tools: an RPM database that rpm
    # makes (its sqlite backend) from packages rpmbuild builds, and `go version -m` of a
    # module-mode Go program it builds
    "rpm:rpm"
    "rpmbuild:rpm"
    "go:golang-go"
  )
fi

apt_updated=0
apt_update() {
  [[ $apt_updated -eq 1 ]] && return 0
  log "apt-get update"
  # Unreachable third-party sources make apt-get update exit non-zero even
  # though the Debian lists are fine; the install below is the real check.
  apt-get -o DPkg::Lock::Timeout=300 update -qq || log "apt-get update reported errors (continuing)"
  apt_updated=1
}

install_missing() {
  local pkgs=() entry cmd pkg
  for entry in "${tools[@]}"; do
    cmd="${entry%%:*}" pkg="${entry#*:}"
    if ! command -v "$cmd" >/dev/null 2>&1 && [[ " ${pkgs[*]-} " != *" $pkg "* ]]; then
      pkgs+=("$pkg")
    fi
  done
  [[ ${#pkgs[@]} -eq 0 ]] && return 0
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && die "missing packages: ${pkgs[*]} (POLYARCH_SKIP_INSTALL=1)"
  [[ $(id -u) -eq 0 ]] || die "missing packages: ${pkgs[*]} and not root"
  apt_update
  log "apt-get install ${pkgs[*]}"
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${pkgs[@]}" </dev/null
  for entry in "${tools[@]}"; do
    command -v "${entry%%:*}" >/dev/null 2>&1 || die "still missing after install: ${entry%%:*}"
  done
}

# ---------------------------------------------------------------- 2. engine
dockerd_log="${POLYARCH_DOCKERD_LOG:-/tmp/polyarch-dockerd.log}"
dockerd_wait="${POLYARCH_DOCKERD_WAIT:-60}"

engine_up() { docker info >/dev/null 2>&1; }

# start_dockerd EXTRA_ARGS... ; returns 0 when `docker info` works in time.
start_dockerd() {
  local args=() pid i
  [[ "${DOCKER_HOST:-}" == unix://* ]] && args+=(-H "$DOCKER_HOST")
  # shellcheck disable=SC2206
  [[ -n "${POLYARCH_DOCKERD_ARGS:-}" ]] && args+=(${POLYARCH_DOCKERD_ARGS})
  args+=("$@")
  log "starting dockerd ${args[*]} (log: $dockerd_log)"
  printf '\n==== %s dockerd %s\n' "$(date -Is)" "${args[*]}" >>"$dockerd_log"
  # setsid + nohup: the engine must outlive this script (make test runs after).
  setsid nohup dockerd "${args[@]}" >>"$dockerd_log" 2>&1 </dev/null &
  pid=$!
  for ((i = 0; i < dockerd_wait * 2; i++)); do
    if engine_up; then log "engine up (dockerd pid $pid)"; return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      log "dockerd exited early; last log lines:"
      tail -n 15 "$dockerd_log" >&2 || true
      return 1
    fi
    sleep 0.5
  done
  log "dockerd did not answer within ${dockerd_wait}s; stopping it"
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  tail -n 15 "$dockerd_log" >&2 || true
  return 1
}

ensure_engine() {
  if engine_up; then return 0; fi
  [[ "${POLYARCH_SKIP_ENGINE:-}" == 1 ]] && die "docker info fails and POLYARCH_SKIP_ENGINE=1"
  command -v dockerd >/dev/null 2>&1 || die "dockerd not installed"
  log "docker info fails; starting an engine"
  if start_dockerd; then return 0; fi
  # Hand-started engines in containers often cannot create docker0
  # ("could not find bridge docker0" / iptables failures). polyarch's helper
  # containers use network none, so no default bridge is fine.
  log "retrying dockerd with --bridge=none"
  if start_dockerd --bridge=none; then return 0; fi
  die "could not start dockerd; see $dockerd_log"
}

# ---------------------------------------------------------------- background builds
# BuildKit, cargo-auditable and mdBook take minutes each to build on a fresh machine and
# need only their sources: each runs beside the rest of the set-up (and beside `make
# test`'s own compiles), and the script waits for them at its end, printing each one's
# output under its name.
jobs_dir="$(mktemp -d)"
declare -A job_pids=()
in_background() {
  local name="$1"
  shift
  "$@" >"$jobs_dir/$name.log" 2>&1 &
  job_pids[$name]=$!
}
wait_for_background() {
  local name failed=()
  for name in "${!job_pids[@]}"; do
    wait "${job_pids[$name]}" || failed+=("$name")
    sed "s/^/[$name] /" "$jobs_dir/$name.log" >&2
  done
  rm -rf "$jobs_dir"
  [[ ${#failed[@]} -eq 0 ]] || die "failed: ${failed[*]} (output above)"
}

# ---------------------------------------------------------------- main
if [[ "$mode" == test ]]; then
  # cargo-auditable from crates.io, for tests/sbom.rs's cross-check of Rust binaries' crates.
  in_background cargo-auditable bash "$root/scripts/crate-tool.sh" cargo-auditable install
  # mdBook for `make docs` (the book under docs/), built from crates.io the first time.
  if [[ "${POLYARCH_SKIP_MDBOOK:-}" != 1 ]]; then
    in_background mdbook bash "$root/scripts/crate-tool.sh" mdbook install
  fi
fi
install_missing
if [[ "${POLYARCH_SKIP_ENGINE:-}" != 1 ]]; then ensure_engine; fi
if [[ "${POLYARCH_SKIP_FIXTURES:-}" != 1 ]]; then bash "$root/fixtures/fetch-busybox.sh"; fi
if [[ "$mode" == demo ]]; then log "ok (demo)"; exit 0; fi
# A standalone buildkitd, built from Debian's archive (with the Go just installed) the
# first time.
if [[ "${POLYARCH_SKIP_BUILDKITD:-}" != 1 ]]; then
  in_background buildkitd bash "$root/scripts/buildkitd.sh" start
fi

# The tests' token server (tests/support/token-server.py) signs with Python's cryptography.
if ! python3 -c 'import cryptography' 2>/dev/null; then
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && die "missing python3-cryptography (POLYARCH_SKIP_INSTALL=1)"
  [[ $(id -u) -eq 0 ]] || die "missing python3-cryptography and not root"
  apt_update
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends python3-cryptography </dev/null
fi
# tests/sbom.rs validates the SBOMs polyarch writes with the SPDX project's own tools.
if ! command -v pyspdxtools >/dev/null 2>&1; then
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && die "missing pyspdxtools (POLYARCH_SKIP_INSTALL=1)"
  log "pip install spdx-tools"
  python3 -m pip install -q spdx-tools==0.8.5 </dev/null 2>/dev/null \
    || python3 -m pip install -q --break-system-packages spdx-tools==0.8.5 </dev/null \
    || die "cannot install spdx-tools (pyspdxtools) from PyPI"
fi
# Docker 26.1 and 28.5 with the containerd image store beside the machine's engine.
if [[ "${POLYARCH_SKIP_DOCKER26:-}" != 1 ]]; then
  bash "$root/scripts/engine26.sh" install
  bash "$root/scripts/engine26.sh" start containerd >/dev/null
fi
if [[ "${POLYARCH_SKIP_DOCKER28:-}" != 1 ]]; then
  bash "$root/scripts/engine28.sh" install
  bash "$root/scripts/engine28.sh" start containerd >/dev/null
fi
# Podman 4.3's Docker-compatible and libpod API on its own socket.
if [[ "${POLYARCH_SKIP_PODMAN:-}" != 1 ]]; then
  bash "$root/scripts/podman.sh" start >/dev/null
fi
# cosign 3.1.1 from Debian sid, for tests/sign.rs's cross-check.
bash "$root/scripts/cosign.sh" >/dev/null
wait_for_background
log "ok"
