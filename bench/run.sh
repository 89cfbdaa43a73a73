#!/usr/bin/env bash
# `make bench`: polyarch against the tools users would otherwise use, in one run, on a
# fresh loopback registry, printed side by side (medians, ratio, PASS/FAIL against the
# targets of issues 12, 25 and 26) and written to bench/results.md.
#
#   Docker 20.10 (the machine's engine, classic store): the classic CLI workflow
#     (DOCKER_BUILDKIT=1 docker build + docker push per platform + docker manifest):
#     cold 2-platform, cold 1-platform, warm rerun; verify-only vs skopeo; a big layer.
#   Docker 26.1 (containerd image store, scripts/engine26.sh): buildx 0.13.1 with the
#     default `docker` driver: cold 2-platform, warm rerun, a 500 MB context with a
#     changed package.json, and 10 images x 2 platforms against `docker buildx bake`.
#   Docker 28.5 (containerd image store, scripts/engine28.sh): buildx 0.29.1 with the
#     default `docker` driver: cold 2-platform, warm rerun.
#   Podman 4.3 (scripts/podman.sh): cold 2-platform against `podman build --platform
#     linux/amd64,linux/arm64 --manifest` + `podman manifest push --all`; warm rerun.
#
#   BENCH_RUNS=N         runs per figure (default 5; median reported: Docker 20.10's image write alone swings by 0.5 s between runs)
#   BENCH_PAIRS=N        pairs of runs (with and without) per added-time figure, issues 37 and 38 (default 7)
#   BENCH_VERIFY_RUNS    runs of each verify-only command (default 100: a run is ~20 ms)
#   BENCH_BIG_MB         size of the big layer in MiB (default 1024; 0 skips it)
#   BENCH_BIG_CLASSIC    1 (default) also time docker build+push of the big layer once
#   BENCH_CTX_MB         size of the big context in MB (default 500)
#   BENCH_SYNC_GB        size of the context whose file sync is measured for memory (default 5; 0 skips)
#   BENCH_IMAGES         images in the many-images figure (default 10)
#   BENCH_ENGINES        "20 26 28 podman" (default) or a subset: which engines' figures to run
#   BENCH_PROFILE=0      no profile runs for missed targets
#   BENCH_KEEP=1         keep the temp dir (logs, contexts, registry data)
#   BENCH_NO_BUILD=1     use the existing target/release/polyarch (no cargo build)
#   BENCH_BIN=PATH       time this polyarch binary instead (no cargo build; e.g. a "before" copy)
#
# Disk: the images a run tags are removed at its end; what Docker 20.10's build cache keeps
# is not (other users share it): several GB a run, where the
# context synced for the memory figure (5 GiB) and the 1 GiB layers stay. Three runs and
# a day's harness builds filled this machine's disk on 2026-12-06 (build caches: 43 GB on
# 20.10, 11 GB on 26.1, 6 GB on 28.5); `docker builder prune` on each engine gives it back.
#
#   Token auth (bench/tokens.sh): token fetches, requests, uploads and mounts of one
#     2-image x 2-platform push, polyarch vs `docker buildx bake` on Docker 26.1.
#
# Fairness (see results.md): every cold run gets a fresh nonce file as the first
# Dockerfile step (so every later step misses the build cache, for both contenders), a
# fresh 20 MB random blob (so no layer can be deduplicated by the registry) and a fresh
# repository. polyarch gets a private POLYARCH_CACHE_DIR per figure. Contenders take
# turns (reversed order on even iterations), and the build caches of the bench's own
# engines (26.1, 28.5) are emptied before each iteration: every run leaves the engine a
# little slower for the next. Before every timed run, `sync` writes back what earlier
# runs (and the new context) left dirty in the page cache, outside the timing, and the
# bench waits for idle CPUs, so no run pays for another's writes or background work.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ -f "$HOME/.cargo/env" ]]; then source "$HOME/.cargo/env"; fi
log() { printf 'bench: %s\n' "$*" >&2; }
# the engines are named explicitly below (the 20.10 figures use the machine's engine)
unset DOCKER_HOST DOCKER_CONTEXT

RUNS="${BENCH_RUNS:-5}"
# A feature's added time is a difference of two noisy runs (each ±0.1-0.2 s on a loaded
# 2-core machine), held to targets of 0.05-0.5 s: more pairs than runs of the plain figures.
PAIRS="${BENCH_PAIRS:-7}"
VRUNS="${BENCH_VERIFY_RUNS:-100}"
BIG_MB="${BENCH_BIG_MB:-1024}"
BIG_CLASSIC="${BENCH_BIG_CLASSIC:-1}"
CTX_MB="${BENCH_CTX_MB:-500}"
SYNC_GB="${BENCH_SYNC_GB:-5}"
NIMG="${BENCH_IMAGES:-10}"
ENGINES="${BENCH_ENGINES:-20 26 28 podman}"
PROFILE="${BENCH_PROFILE:-1}"
on20=0 on26=0 on28=0 onpm=0
[[ " $ENGINES " == *" 28 "* ]] && on28=1
[[ " $ENGINES " == *" podman "* ]] && onpm=1
[[ " $ENGINES " == *" 20 "* ]] && on20=1
[[ " $ENGINES " == *" 26 "* ]] && on26=1
started=$(date +%s)

# ------------------------------------------------------------------ prerequisites
# The engines, registry and clients come from the environment script the tests use
# (it also starts Docker 26.1 with the containerd store); the bench's own tools are
# installed here when missing (as root), like everything else.
bash scripts/ensure-env.sh
missing=()
for tool in hyperfine:hyperfine time:time strace:strace openssl:openssl curl:curl python3:python3; do
  cmd=${tool%%:*}
  [[ $cmd == time ]] && cmd=/usr/bin/time
  command -v "$cmd" >/dev/null || missing+=("${tool##*:}")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    log "missing ${missing[*]}: apt-get install ${missing[*]}"
    exit 1
  fi
  log "apt-get install ${missing[*]}"
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi
bin="${BENCH_BIN:-$root/target/release/polyarch}"
if [[ -n "${BENCH_BIN:-}" || ("${BENCH_NO_BUILD:-}" == 1 && -x "$bin") ]]; then
  log "using the existing $bin"
else
  log "cargo build --release"
  cargo build --release -q
fi

# The classic workflow needs a client whose `docker build` speaks BuildKit. Docker
# CLI >= 23 delegates that to the buildx plugin; without it, DOCKER_BUILDKIT=1 fails
# and the legacy builder cannot build FROM scratch for a foreign platform. A 20.10
# client (Debian's docker.io) still has BuildKit built in, so prefer it then.
classic_note=""
if docker buildx version >/dev/null 2>&1; then
  DOCKER=docker
else
  DOCKER=""
  for c in $(which -a docker | awk '!seen[$0]++'); do
    v="$("$c" version --format '{{.Client.Version}}' 2>/dev/null || true)"
    if [[ "${v%%.*}" =~ ^[0-9]+$ && "${v%%.*}" -lt 23 ]]; then DOCKER="$c"; break; fi
  done
  [[ -n "$DOCKER" ]] || { log "no docker client can run DOCKER_BUILDKIT=1 docker build (no buildx, no client < 23)"; exit 1; }
  classic_note="the default client ($(docker version --format '{{.Client.Version}}')) has no buildx plugin, so its \`DOCKER_BUILDKIT=1 docker build\` fails; the classic workflow uses $DOCKER ($("$DOCKER" version --format '{{.Client.Version}}'), BuildKit built in)."
fi
export DOCKER_BUILDKIT=1 DOCKER_CLI_EXPERIMENTAL=enabled
H20="unix:///var/run/docker.sock"
engine_version="$(DOCKER_HOST=$H20 docker version --format '{{.Server.Version}}')"
engine_driver="$(DOCKER_HOST=$H20 docker info --format '{{.Driver}}' 2>/dev/null || true)"

# ------------------------------------------------------------------ temp + registry
tmp="$(mktemp -d -t polyarch-bench.XXXXXX)"
reg_pid=""
host=""
H26="" D26BIN="" D26CFG="" H28="" D28BIN=""
d26() { DOCKER_HOST="$H26" DOCKER_CONFIG="$D26CFG" "$D26BIN/docker" "$@"; }

# QEMU: the RUN step on arm64 needs qemu-aarch64 in binfmt_misc. The bench registers
# it the way users do (an untimed polyarch build with `binfmt: auto`); what was there
# before is written down here and restored at exit: an entry the bench added is
# removed again, and binfmt_misc is unmounted again if it was not mounted.
BF=/proc/sys/fs/binfmt_misc
bf_mounted_before=0 bf_entry_before="" bf_exec_before=0
[[ -e $BF/register ]] && bf_mounted_before=1
[[ -e $BF/qemu-aarch64 ]] && bf_entry_before="$(cat $BF/qemu-aarch64)"
fixtures/busybox/arm64/busybox true >/dev/null 2>&1 && bf_exec_before=1
bf_found="binfmt_misc $([[ $bf_mounted_before == 1 ]] && echo mounted || echo 'not mounted'), qemu-aarch64 $([[ -n $bf_entry_before ]] && echo registered || echo 'not registered'), an arm64 binary $([[ $bf_exec_before == 1 ]] && echo runs || echo 'does not run') on the host"
log "before: $bf_found"
restore_binfmt() {
  if [[ -z "$bf_entry_before" && $bf_exec_before == 0 && -e $BF/qemu-aarch64 ]]; then
    echo -1 >$BF/qemu-aarch64 && log "binfmt: removed qemu-aarch64 (registered by this bench)"
  elif [[ -n "$bf_entry_before" && ! -e $BF/qemu-aarch64 ]]; then
    log "binfmt: qemu-aarch64 was registered before and is gone now (not by this bench)"
  fi
  if [[ $bf_mounted_before == 0 ]] && mountpoint -q $BF; then
    if [[ -z "$(ls $BF | grep -v -x -e register -e status)" ]]; then
      umount $BF && log "binfmt: unmounted binfmt_misc (mounted by this bench)"
    else
      log "binfmt: binfmt_misc was not mounted before, but now holds entries others registered ($(ls $BF | grep -v -x -e register -e status | tr '\n' ' ')); left mounted"
    fi
  fi
}

cleanup() {
  set +e
  if stop_registry; then
    log "registry stopped"
  fi
  if [[ -n "$host" ]]; then # images this run tagged in the engines (nothing else)
    DOCKER_HOST=$H20 docker images --format '{{.Repository}}:{{.Tag}}' | grep -F "$host/" | xargs -r env DOCKER_HOST=$H20 docker image rm -f >/dev/null 2>&1
    if [[ -n "$H26" ]]; then
      d26 images --format '{{.Repository}}:{{.Tag}}' | grep -F "$host/" | xargs -r "$D26BIN/docker" -H "$H26" image rm -f >/dev/null 2>&1
    fi
    if [[ -n "$H28" ]]; then
      "$D28BIN/docker" -H "$H28" images --format '{{.Repository}}:{{.Tag}}' | grep -F "$host/" | xargs -r "$D28BIN/docker" -H "$H28" image rm -f >/dev/null 2>&1
    fi
  fi
  restore_binfmt
  if [[ "${BENCH_KEEP:-}" == 1 ]]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=../scripts/registry.sh
source "$root/scripts/registry.sh"
start_registry warn && host="127.0.0.1:$registry_port"
[[ -n "$host" ]] || { log "could not start docker-registry"; exit 1; }
log "registry at http://$host (pid $reg_pid); temp $tmp"

if [[ $on26 == 1 ]]; then
  H26="$(bash scripts/engine26.sh start containerd)"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$tmp/sign.pem" 2>/dev/null
  # What the fixture cosign key's derivation alone costs on this machine, idle (OpenSSL's
  # scrypt, median of 3): any tool opening the key pays it, and the figure of issue 38 is
  # read against it (it was 0.20 s on one machine of this kind and 0.33 s on another).
  scrypt_s=$(python3 -c '
import hashlib, statistics, time
runs = []
for _ in range(3):
    t = time.perf_counter()
    hashlib.scrypt(b"polyarch-fixture", salt=bytes(32), n=65536, r=8, p=1, maxmem=128 << 20, dklen=64)
    runs.append(time.perf_counter() - t)
print(f"{statistics.median(runs):.2f}")')
  D26BIN="$(bash scripts/engine26.sh bin)"
  # a private DOCKER_CONFIG with buildx as a CLI plugin (buildx keeps its state there)
  D26CFG="$tmp/docker-config"
  mkdir -p "$D26CFG/cli-plugins"
  ln -s "$(bash scripts/engine26.sh docker-config)/cli-plugins/docker-buildx" "$D26CFG/cli-plugins/docker-buildx"
  printf '{}\n' >"$D26CFG/config.json"
  engine26_version="$(d26 version --format '{{.Server.Version}}')"
  engine26_driver="$(d26 info --format '{{.Driver}} {{range .DriverStatus}}{{index . 1}}{{end}}')"
  buildx_version="$(d26 buildx version | awk '{print $2}')"
  d26 buildx inspect default >/dev/null # the docker driver's default builder answers
fi

if [[ $on28 == 1 ]]; then
  H28="$(bash scripts/engine28.sh start containerd)"
  D28BIN="$(bash scripts/engine28.sh bin)"
  D28CFG="$tmp/docker28-config"
  mkdir -p "$D28CFG/cli-plugins"
  ln -s "$(bash scripts/engine28.sh docker-config)/cli-plugins/docker-buildx" "$D28CFG/cli-plugins/docker-buildx"
  printf '{}\n' >"$D28CFG/config.json"
  d28() { DOCKER_HOST="$H28" DOCKER_CONFIG="$D28CFG" "$D28BIN/docker" "$@"; }
  engine28_version="$(d28 version --format '{{.Server.Version}}')"
  buildx28_version="$(d28 buildx version | awk '{print $2}')"
fi
if [[ $onpm == 1 ]]; then
  HPM="$(bash scripts/podman.sh start)"
  pm() { bash "$root/scripts/podman.sh" podman "$@"; }
  podman_version="$(pm version --format '{{.Server.Version}}' 2>/dev/null || pm --version | awk '{print $3}')"
fi

# ------------------------------------------------------------------ helpers
WITH_RUN=1 BINFMT=auto run_note=""
# make_ctx DIR: FROM scratch, busybox per arch, RUN under QEMU for arm64, 20 MB blob.
# RUN steps use no network for both contenders.
make_ctx() {
  local dir="$1" a
  mkdir -p "$dir"
  for a in amd64 arm64; do install -D -m 0755 "fixtures/busybox/$a/busybox" "$dir/bin/$a/busybox"; done
  cat >"$dir/Dockerfile" <<'EOF'
FROM scratch
ARG TARGETARCH
COPY nonce /nonce
COPY bin/${TARGETARCH}/busybox /bin/busybox
EOF
  if [[ "$WITH_RUN" == 1 ]]; then echo 'RUN ["/bin/busybox", "--install", "-s", "/bin"]' >>"$dir/Dockerfile"; fi
  printf 'COPY blob /blob\nENTRYPOINT ["/bin/busybox", "sh"]\n' >>"$dir/Dockerfile"
  printf '%s-%s\n' "$(date +%s%N)" "$RANDOM" >"$dir/nonce"
  head -c 20000000 /dev/urandom >"$dir/blob"
}
# make_small DIR: one of the many small images: busybox per arch, a fresh nonce and
# 1 MB of its own random data, COPY only.
make_small() {
  local dir="$1" a
  mkdir -p "$dir"
  for a in amd64 arm64; do install -D -m 0755 "fixtures/busybox/$a/busybox" "$dir/bin/$a/busybox"; done
  cat >"$dir/Dockerfile" <<'EOF'
FROM scratch
ARG TARGETARCH
COPY nonce /nonce
COPY bin/${TARGETARCH}/busybox /bin/busybox
COPY data /data
ENTRYPOINT ["/bin/busybox", "sh"]
EOF
  printf '%s-%s\n' "$(date +%s%N)" "$RANDOM" >"$dir/nonce"
  head -c 1000000 /dev/urandom >"$dir/data"
}
# project_image NAME CONTEXT REPO PLATFORMS: one image entry of a polyarch.yaml
project_image() {
  cat <<YAML
  $1:
    repository: $3
    tags: [t]
    context: $2
    platforms: [$4]
    network: none
YAML
}
# write_project DIR REPO PLATFORMS -> DIR.polyarch.yaml
# (project file and record live beside the context, not in it)
write_project() {
  { printf 'version: 1\nbinfmt: %s\nimages:\n' "$BINFMT"; project_image x "$1" "$2" "$3"; } >"$1.polyarch.yaml"
}
plats_of() { local a p=""; for a in $1; do p+="${p:+, }linux/$a"; done; printf '%s' "$p"; }

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f\n", b - a }'; }
# median of the arguments
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a != "" && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
fmt() { awk -v a="$1" 'BEGIN { if (a == "" || a == "n/a") print "n/a"; else printf "%.2f", a }'; }
passfail() { awk -v v="$1" -v t="$2" 'BEGIN { print (v != "n/a" && v <= t) ? "PASS" : "FAIL" }'; }

# polyarch against one engine, with one private cache dir.
PA_HOST="$H20" PA_CACHE=""
pa() { DOCKER_HOST="$PA_HOST" POLYARCH_CACHE_DIR="$PA_CACHE" "$bin" "$@"; }
# use_cache NAME: a fresh private cache dir for one figure. It starts with the emulation
# memory of the warm-up on the same engine (which kernel emulators are registered, as
# any user's cache holds after a first build), never with build or push memory.
use_cache() {
  PA_CACHE="$tmp/cache/$1"
  mkdir -p "$PA_CACHE"
  local seed="$tmp/cache/warmup-${PA_ENGINE}/emulation.json"
  [[ -f "$seed" && ! -f "$PA_CACHE/emulation.json" ]] && cp "$seed" "$PA_CACHE/"
  return 0
}
PA_ENGINE=20

# run_pa FILE: polyarch build of a project file -> prints elapsed seconds
run_pa() { # PROJECT [EXTRA FLAGS…]
  local t0
  t0=$(now)
  pa build -f "$1" --record "$1.record.json" --quiet "${@:2}" >>"$tmp/polyarch.out" 2>>"$tmp/polyarch.err" </dev/null \
    || { log "polyarch build -f $1 failed (see below)"; tail -n 8 "$tmp/polyarch.err" >&2; return 1; }
  since "$t0"
}
run_polyarch() { # DIR REPO "amd64 arm64"
  write_project "$1" "$2" "$(plats_of "$3")"
  run_pa "$1.polyarch.yaml"
}
# run_tested DIR REPO "amd64 arm64": polyarch with `test:` (issue 37) on every platform
run_tested() {
  write_project "$1" "$2" "$(plats_of "$3")"
  printf '    test: {run: [/bin/busybox, "true"]}\n' >>"$1.polyarch.yaml"
  run_pa "$1.polyarch.yaml"
}
# run_attested DIR REPO "amd64 arm64": polyarch attaching an SBOM to each platform and
# signing the index and each platform manifest (issue 38), with the fixture cosign key
run_attested() {
  write_project "$1" "$2" "$(plats_of "$3")"
  COSIGN_PASSWORD=polyarch-fixture run_pa "$1.polyarch.yaml" --sbom --sign-key "$root/fixtures/sign/cosign.key"
}
# run_attested_pem DIR REPO "amd64 arm64": the same with a PKCS#8 P-256 key (made once by
# openssl below), which opens with no key derivation: cosign's key file seals its key
# with scrypt (N = 65536, 64 MiB), CPU that any tool opening it pays (measured below).
run_attested_pem() {
  write_project "$1" "$2" "$(plats_of "$3")"
  run_pa "$1.polyarch.yaml" --sbom --sign-key "$tmp/sign.pem"
}
run_classic() { # DIR REPO "amd64 arm64"
  local dir="$1" repo="$2" a t0 refs=()
  t0=$(now)
  # (every step chained: errexit does not reach into a function run in $(…) or ||)
  {
    if [[ "$3" == *" "* ]]; then
      for a in $3; do
        "$DOCKER" build -q --network none --platform "linux/$a" -t "$repo:t-$a" "$dir" &&
          "$DOCKER" push -q "$repo:t-$a" || return 1
        refs+=("$repo:t-$a")
      done
      "$DOCKER" manifest create --amend --insecure "$repo:t" "${refs[@]}" &&
        "$DOCKER" manifest push --purge --insecure "$repo:t"
    else # one platform: users push the tag itself, no manifest list
      "$DOCKER" build -q --network none --platform "linux/$3" -t "$repo:t" "$dir" &&
        "$DOCKER" push -q "$repo:t"
    fi && skopeo inspect --raw --tls-verify=false "docker://$repo:t"
  } >>"$tmp/classic.out" 2>>"$tmp/classic.err" </dev/null \
    || { log "classic workflow failed"; tail -n 20 "$tmp/classic.err" >&2; return 1; }
  since "$t0"
}
# buildx on Docker 26.1: one multi-platform build pushed as an index, then the same
# read-back the classic workflow does (skopeo inspect --raw of the tag).
BX=d26 # which engine's docker CLI runs buildx (d26, d28)
run_buildx() { # DIR REPO "amd64 arm64"
  local dir="$1" repo="$2" a t0 plats=""
  for a in $3; do plats+="${plats:+,}linux/$a"; done
  t0=$(now)
  {
    "$BX" buildx build -q --platform "$plats" --provenance=false --network none --push -t "$repo:t" "$dir" &&
      skopeo inspect --raw --tls-verify=false "docker://$repo:t"
  } >>"$tmp/buildx.out" 2>>"$tmp/buildx.err" </dev/null \
    || { log "buildx build failed"; tail -n 20 "$tmp/buildx.err" >&2; return 1; }
  since "$t0"
}
# Podman's own multi-platform workflow: one build into a local manifest list, then a
# push of the list and all its images, then the same read-back.
run_podman() { # DIR REPO "amd64 arm64"
  local dir="$1" repo="$2" a t0 plats="" list
  for a in $3; do plats+="${plats:+,}linux/$a"; done
  list="localhost/bench-list-$RANDOM$RANDOM"
  t0=$(now)
  {
    pm build -q --network none --platform "$plats" --manifest "$list" "$dir" &&
      pm manifest push --all --tls-verify=false "$list" "docker://$repo:t" &&
      skopeo inspect --raw --tls-verify=false "docker://$repo:t"
  } >>"$tmp/podman.out" 2>>"$tmp/podman.err" </dev/null \
    || { log "podman build failed"; tail -n 20 "$tmp/podman.err" >&2; return 1; }
  since "$t0"
  pm manifest rm "$list" >/dev/null 2>&1 || true
}
# run_bake FILE TAG...: docker buildx bake of a generated docker-bake.hcl, then a
# read-back of every tag.
run_bake() {
  local file="$1" t0 ref
  shift
  t0=$(now)
  {
    d26 buildx bake -f "$file" --provenance=false --push &&
      for ref in "$@"; do skopeo inspect --raw --tls-verify=false "docker://$ref" || return 1; done
  } >>"$tmp/buildx.out" 2>>"$tmp/buildx.err" </dev/null \
    || { log "buildx bake failed"; tail -n 20 "$tmp/buildx.err" >&2; return 1; }
  since "$t0"
}

# qemu_ok: qemu-aarch64 is registered and enabled (someone else's clean-up may have
# removed it mid-bench; buildx and the classic CLI cannot register it themselves)
qemu_ok() { [[ $WITH_RUN == 0 ]] || grep -qx enabled $BF/qemu-aarch64 2>/dev/null || fixtures/busybox/arm64/busybox true >/dev/null 2>&1; }
# warmup ENGINE: an untimed polyarch build on that engine with `binfmt: auto`, which
# registers QEMU for arm64 when it is missing (and leaves the emulation memory that
# use_cache hands on)
warmup() {
  local d
  PA_CACHE="$tmp/cache/warmup-$PA_ENGINE"
  mkdir -p "$PA_CACHE"
  d="$tmp/warmup-$PA_ENGINE-$RANDOM"
  make_ctx "$d"
  run_polyarch "$d" "$host/warmup/polyarch-$PA_ENGINE-$RANDOM" "amd64 arm64" >/dev/null
}
ensure_qemu() {
  qemu_ok && return 0
  log "qemu-aarch64 is not registered (any more); registering it again with a polyarch warm-up build"
  reregistered=1
  local c="$PA_CACHE"
  warmup
  PA_CACHE="$c"
}
reregistered=0

declare -A T M
declare -A R # seconds by "KEY#RUN", for the paired differences
add() { T[$1]+="$2 "; R["$1#$3"]=$2; log "$1 run $3: $2s"; }
# paired A B: the median over a loop's iterations of A's run minus B's run in the same
# iteration; "n/a" when no iteration has both. Steadier than the difference of the
# medians when the engine drifts over the loop.
paired() {
  local i d=()
  for ((i = 1; i <= RUNS || i <= PAIRS; i++)); do
    [[ -n "${R[$1#$i]:-}" && -n "${R[$2#$i]:-}" ]] || continue
    d+=("$(awk -v a="${R[$1#$i]}" -v b="${R[$2#$i]}" 'BEGIN { printf "%.3f", a - b }')")
  done
  if ((${#d[@]})); then median "${d[@]}"; else echo n/a; fi
}
failed_run() {
  local f
  log "$1 run $2 failed; the logs end with:"
  for f in polyarch classic buildx podman; do [[ -s "$tmp/$f.err" ]] && { echo "== $f" && tail -n 6 "$tmp/$f.err"; } >&2; done
  return 0
}
# settle: waits (at most 3 s) until the CPUs were at least 90 % idle over 0.1 s, so no
# run starts while the engine still finishes the previous one's work in the background
# (containerd's garbage collection, a test container's removal, buildx's build record);
# that work would otherwise be charged to whichever contender comes next in the loop.
settle() {
  local tries a b
  for ((tries = 0; tries < 30; tries++)); do
    a=($(head -n 1 /proc/stat))
    sleep 0.1
    b=($(head -n 1 /proc/stat))
    # fields: user nice system idle iowait irq softirq steal (waiting on the disk is not idle)
    awk -v t0="$((a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7] + a[8]))" -v i0="${a[4]}" \
      -v t1="$((b[1] + b[2] + b[3] + b[4] + b[5] + b[6] + b[7] + b[8]))" -v i1="${b[4]}" \
      'BEGIN { exit !(t1 > t0 && (i1 - i0) / (t1 - t0) >= 0.9) }' && return 0
  done
  return 0
}
# in_turn RUN CONTENDER…: the contenders in the order given on odd runs, reversed on even
# ones. Each run leaves the engine a little slower for the next (its build cache and
# image store grow: on Docker 26.1, 1.0 s cold builds took 1.4 s eighteen runs later),
# so a fixed order would charge the later contenders for the earlier ones' runs.
in_turn() {
  local run="$1"
  shift
  if ((run % 2)); then printf '%s\n' "$@"; else printf '%s\n' "$@" | tac; fi
}
# fresh_cache: empties the build cache of the bench's own engine (Docker 26.1 or 28.5, which
# only polyarch's tests and this bench use) before an iteration of its loop, so every
# iteration starts from the same engine state.
fresh_cache() { DOCKER_HOST="$PA_HOST" "$1/docker" builder prune -af >/dev/null 2>&1 || true; }
# cold CONTENDER KEY DIR REPO PLATFORMS RUN: a fresh context, then one timed run. A run
# that fails because the QEMU registration vanished under it (another job's clean-up)
# is made again on a fresh context once the registration is back.
cold() {
  local s
  make_ctx "$3"
  ensure_qemu
  sync
  settle
  if ! s=$("run_$1" "$3" "$4" "$5"); then
    qemu_ok && { failed_run "$2" "$6"; return 1; }
    ensure_qemu
    make_ctx "$3"
    sync
    settle
    s=$("run_$1" "$3" "$4" "$5")
  fi
  add "$2" "$s" "$6"
}
# warm CONTENDER KEY DIR REPO PLATFORMS RUN: the same context and repository again.
warm() {
  local s
  sync
  settle
  if ! s=$("run_$1" "$3" "$4" "$5"); then
    qemu_ok && { failed_run "$2" "$6"; return 1; }
    ensure_qemu
    sync
    settle
    s=$("run_$1" "$3" "$4" "$5")
  fi
  add "$2" "$s" "$6"
}

# measured_build NAME FILE: one polyarch build of FILE under /usr/bin/time -v; sets
# measured_wall (seconds) and measured_rss_mib (the polyarch process's peak RSS; the
# engine's and the registry's memory is not counted). A failed build ends the bench.
measured_build() { # NAME FILE [EXTRA FLAGS…]
  local name="$1" file="$2"
  sync
  /usr/bin/time -v -o "$tmp/$name.time" env DOCKER_HOST="$PA_HOST" POLYARCH_CACHE_DIR="$PA_CACHE" \
    "$bin" build -f "$file" --record "$file.record.json" --quiet "${@:3}" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" </dev/null \
    || { log "polyarch $name build failed"; tail -n 20 "$tmp/$name.err" >&2; exit 1; }
  read -r measured_wall measured_rss_mib < <(awk -F': ' '
    /Elapsed \(wall clock\)/ { n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; wall = s }
    /Maximum resident set size/ { rss = $2 / 1024 }
    END { printf "%.2f %.1f\n", wall, rss }' "$tmp/$name.time")
}

# ------------------------------------------------------------------ profiles
# profile_run NAME FILE: one more polyarch build of FILE with --output-format json,
# every stderr line stamped on arrival; bench/phases.py turns it into a table.
declare -A P
# stamped LOG CMD...: runs CMD with its stderr stamped line by line into LOG; sets
# stamp_t0/stamp_t1 (epoch seconds) around CMD alone. The stamper is started and reading
# before CMD starts (a FIFO it opens once it runs), so no line waits for Python's start-up
# (which on a loaded machine took longer than polyarch's own start-up, and made every
# early event look as late as the first one read).
stamped() {
  local log="$1" fifo="$1.fifo" sp
  shift
  rm -f "$fifo" "$fifo.ready"
  mkfifo "$fifo"
  python3 -u "$root/bench/stamp.py" "$fifo" "$fifo.ready" >"$log" &
  sp=$!
  while [[ ! -e "$fifo.ready" ]]; do sleep 0.01; done
  stamp_t0=$(now)
  "$@" </dev/null 2>"$fifo" >/dev/null || true
  stamp_t1=$(now)
  wait "$sp" || true
  rm -f "$fifo" "$fifo.ready"
}
# Extra arguments go to polyarch build; PROFILE_BRIEF=1 keeps only the wall time and
# the per-image line.
profile_run() {
  local name="$1" file="$2"
  shift 2
  stamped "$tmp/profile-$name.log" pa build -f "$file" --record "$file.record.json" --output-format json "$@"
  P[$name]="$(python3 "$root/bench/phases.py" "$tmp/profile-$name.log" "$stamp_t0" "$stamp_t1" ${PROFILE_BRIEF:+--brief} 2>&1 || true)"
}
# overheads KEY: polyarch's own time outside the engine's solve and push (issue 26), from
# RUNS more cold 2-platform runs stamped as profile_run stamps them: the start-up (process
# start to BuildKit's first step status) and the tail (last platform pushed to exit:
# index, read-back, record); then the warm rerun of each, whose whole wall is polyarch's.
overheads() {
  local key="$1" i d s e o
  use_cache "oh-$key"
  for ((i = 1; i <= RUNS; i++)); do
    d="$tmp/oh-$key-$i"
    make_ctx "$d"
    ensure_qemu
    write_project "$d" "$host/oh-$key-$i/x" "linux/amd64, linux/arm64"
    stamped "$tmp/oh-$key-$i.log" pa build -f "$d.polyarch.yaml" --record "$d.record.json" --output-format json
    if read -r s e o < <(python3 "$root/bench/phases.py" "$tmp/oh-$key-$i.log" "$stamp_t0" "$stamp_t1" --overheads 2>>"$tmp/polyarch.err"); then
      add "oh-$key-start" "$s" "$i"
      add "oh-$key-own" "$o" "$i"
      add "oh-$key-tail" "$e" "$i"
      add "oh-$key-cold" "$(awk -v a="$s" -v b="$e" 'BEGIN { printf "%.3f", a + b }')" "$i"
      add "oh-$key-owncold" "$(awk -v a="$o" -v b="$e" 'BEGIN { printf "%.3f", a + b }')" "$i"
    else
      failed_run "oh-$key" "$i"
    fi
    add "oh-$key-warm" "$(run_pa "$d.polyarch.yaml")" "$i"
  done
}
# syscall_profile NAME CMD...: the requests and file opens of one more run under strace
# (slower under strace: the counts matter, not the times), and the run's CPU time;
# SP_PREP names a function to call before each of the two runs.
syscall_profile() {
  local name="$1" cpu
  shift
  [[ -z "${SP_PREP:-}" ]] || $SP_PREP
  strace -f -tt -s 64 -e trace=connect,openat,sendto,write,writev -o "$tmp/strace-$name.txt" \
    env DOCKER_HOST="$PA_HOST" POLYARCH_CACHE_DIR="$PA_CACHE" "$@" </dev/null >/dev/null 2>&1 || true
  [[ -z "${SP_PREP:-}" ]] || $SP_PREP
  /usr/bin/time -f '%e %U %S' -o "$tmp/time-$name.txt" env DOCKER_HOST="$PA_HOST" POLYARCH_CACHE_DIR="$PA_CACHE" "$@" </dev/null >/dev/null 2>&1 || true
  cpu=$(tail -n 1 "$tmp/time-$name.txt")
  printf '%s\n\n' "One more run without strace: $(awk '{ printf "%.2fs wall, %.2fs CPU (user %.2fs + system %.2fs)", $1, $2 + $3, $2, $3 }' <<<"$cpu"). The same run under \`strace -f\`: $(python3 "$root/bench/syscalls.py" "$tmp/strace-$name.txt" 2>&1 || true)"
}

if [[ $on20 == 1 ]]; then
  # ================================================================ Docker 20.10
  PA_ENGINE=20 PA_HOST="$H20"
  log "20.10 warm-up: polyarch build (registers binfmt for arm64 when missing), classic build"
  if ! warmup; then
    if grep -q 'emulation' "$tmp/polyarch.err"; then
      run_note="QEMU emulation could not be made to work on this engine (polyarch: \`$(grep -m1 '^error: emulation' "$tmp/polyarch.err" | cut -c1-400)\`), so the fixture has NO \`RUN\` step and projects use \`binfmt: never\`; no contender can run an arm64 RUN here."
      log "emulation unavailable: dropping the RUN step, binfmt: never"
      WITH_RUN=0 BINFMT=never
      warmup
    else
      exit 1
    fi
  fi
  binfmt_line="$(grep -i -m1 -E 'binfmt|emulat|qemu' "$tmp/polyarch.err" || true)"
  make_ctx "$tmp/warmup-c"
  run_classic "$tmp/warmup-c" "$host/warmup/classic" "amd64 arm64" >/dev/null

  # cold + warm; one cache dir for the figure (cold runs never match: fresh inputs)
  use_cache c20
  for ((i = 1; i <= RUNS; i++)); do
    for c in $(in_turn "$i" polyarch classic); do
      for plats in "amd64 arm64" "amd64"; do
        key="c20-$c-$(wc -w <<<"$plats")p"
        cold "$c" "$key" "$tmp/$key-$i" "$host/$key-$i/x" "$plats" "$i"
      done
      # warm: the same context, repository and tag again (nothing changed)
      warm "$c" "c20-$c-warm" "$tmp/c20-$c-2p-$i" "$host/c20-$c-2p-$i/x" "amd64 arm64" "$i"
    done
  done

  # verify-only
  ref="$host/c20-polyarch-2p-1/x:t"
  log "verify-only: $VRUNS runs each of polyarch verify / skopeo inspect --raw ($ref)"
  DOCKER_HOST="$H20" POLYARCH_CACHE_DIR="$PA_CACHE" \
    hyperfine -N --warmup 2 --runs "$VRUNS" --export-json "$tmp/verify.json" \
    -n polyarch "$bin verify $ref --platform linux/amd64,linux/arm64 --quiet" \
    -n skopeo "skopeo inspect --raw --tls-verify=false docker://$ref" \
    >"$tmp/hyperfine.out" 2>&1 || { cat "$tmp/hyperfine.out" >&2; exit 1; }
  read -r v_pa v_sk < <(python3 - "$tmp/verify.json" <<'PY'
import json, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
print("%.4f %.4f" % (r["polyarch"]["median"], r["skopeo"]["median"]))
PY
  )
  M[v-pa]=$v_pa M[v-sk]=$v_sk

  # big layer
  big_wall="" big_rss_mib="" big_classic="" gen_s="" big_sbom_wall="" big_sbom_rss_mib=""
  if ((BIG_MB > 0)); then
    log "big layer: ${BIG_MB} MiB of incompressible data (AES-CTR keystream)"
    big="$tmp/big"
    mkdir -p "$big"
    printf 'FROM scratch\nCOPY big /big\n' >"$big/Dockerfile"
    t0=$(now)
    openssl enc -aes-128-ctr -nosalt -pass "pass:$RANDOM$RANDOM" -pbkdf2 </dev/zero 2>/dev/null \
      | head -c "$((BIG_MB * 1024 * 1024))" >"$big/big" || true # openssl dies of SIGPIPE
    [[ "$(stat -c %s "$big/big")" == "$((BIG_MB * 1024 * 1024))" ]] || { log "could not generate the big file"; exit 1; }
    gen_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    use_cache big
    write_project "$big" "$host/big/polyarch" "linux/amd64"
    measured_build big "$big.polyarch.yaml"
    big_wall=$measured_wall big_rss_mib=$measured_rss_mib
    # the same image again with --sbom (issue 38): its layer read back and catalogued
    measured_build big-sbom "$big.polyarch.yaml" --sbom
    big_sbom_wall=$measured_wall big_sbom_rss_mib=$measured_rss_mib
    if [[ "$BIG_CLASSIC" == 1 ]]; then
      sync
      t0=$(now)
      { "$DOCKER" build -q -t "$host/big/classic:t" "$big" && "$DOCKER" push -q "$host/big/classic:t"; } \
        >>"$tmp/classic.out" 2>>"$tmp/classic.err" </dev/null && big_classic=$(since "$t0")
    fi
    rm -f "$big/big"
  fi

  # memory while serving a huge context by file sync: SYNC_GB of sparse 256 MiB files
  # (read as zeros, sent in full), all of it bind-mounted into a RUN so the engine asks
  # for every byte, and no layer of it is pushed
  sync_wall="" sync_rss_mib=""
  if ((SYNC_GB > 0)); then
    log "huge context: ${SYNC_GB} GiB sent by file sync"
    sync="$tmp/sync"
    mkdir -p "$sync/data"
    install -D -m 0755 fixtures/busybox/amd64/busybox "$sync/busybox"
    for ((j = 0; j < SYNC_GB * 4; j++)); do truncate -s 256M "$sync/data/f$j"; done
    printf 'FROM scratch\nCOPY busybox /bin/busybox\nCOPY nonce /nonce\nRUN --mount=type=bind,target=/ctx ["/bin/busybox", "du", "-s", "/ctx/data"]\n' >"$sync/Dockerfile"
    printf '%s\n' "$(date +%s%N)" >"$sync/nonce"
    use_cache sync
    write_project "$sync" "$host/sync/polyarch" "linux/amd64"
    measured_build sync "$sync.polyarch.yaml"
    sync_wall=$measured_wall sync_rss_mib=$measured_rss_mib
    rm -rf "$sync/data"
  fi
fi

if [[ $on26 == 1 ]]; then
  # ================================================================ Docker 26.1
  PA_ENGINE=26 PA_HOST="$H26"
  log "26.1 warm-up: polyarch build (emulation memory for this engine), buildx build"
  warmup
  make_ctx "$tmp/warmup-bx"
  qemu_ok || ensure_qemu
  run_buildx "$tmp/warmup-bx" "$host/warmup/buildx" "amd64 arm64" >/dev/null

  # cold + warm, 2 platforms
  use_cache c26
  for ((i = 1; i <= RUNS; i++)); do
    fresh_cache "$D26BIN"
    for c in $(in_turn "$i" polyarch buildx); do
      key="c26-$c-2p"
      cold "$c" "$key" "$tmp/$key-$i" "$host/$key-$i/x" "amd64 arm64" "$i"
      warm "$c" "c26-$c-warm" "$tmp/$key-$i" "$host/$key-$i/x" "amd64 arm64" "$i"
    done
  done
  # What a feature adds (a test: on both platforms, issue 37; --sbom --sign-key, issue 38):
  # each run with it is paired with a plain polyarch run right beside it, the two in turn
  # (plain first in odd iterations), so both meet the same engine state: a run leaves the
  # engine a little slower for the next, and a plain run four places away in the loop
  # charged that drift (0.1-0.3 s) to the feature.
  for ((i = 1; i <= PAIRS; i++)); do
    fresh_cache "$D26BIN"
    for c in tested attested attested_pem; do
      use_cache "c26-$c"
      for r in $(in_turn "$i" "plain_$c" "$c"); do
        key="c26-$r-2p"
        [[ $r == plain_* ]] && run=polyarch || run=$r
        cold "$run" "$key" "$tmp/$key-$i" "$host/$key-$i/x" "amd64 arm64" "$i"
        warm "$run" "c26-$r-warm" "$tmp/$key-$i" "$host/$key-$i/x" "amd64 arm64" "$i"
      done
    done
  done

  # big context: COPY package.json / only, package.json changed before every run
  log "big context: ${CTX_MB} MB of node_modules/ (random data, many files), made once"
  c500="$tmp/ctx$CTX_MB"
  t0=$(now)
  ctx_made="$(python3 "$root/bench/gen-node-modules.py" "$c500" "$CTX_MB")"
  ctx_gen_s=$(since "$t0")
  log "big context: $ctx_made in ${ctx_gen_s}s"
  ctx_count=$(find "$c500" -type f | wc -l)
  ctx_du=$(du -sm "$c500" | cut -f1)
  use_cache ctx
  printf 'version: 1\nbinfmt: %s\nimages:\n' "$BINFMT" >"$c500.polyarch.yaml"
  project_image app "$c500" "$host/ctx/polyarch" "linux/amd64, linux/arm64" >>"$c500.polyarch.yaml"
  change_pkg() { printf '{"name": "bench", "version": "1.0.%s", "nonce": "%s"}\n' "$RANDOM" "$(date +%s%N)" >"$c500/package.json" && sync; }
  # untimed first builds: the figure is the rebuild after an edit
  change_pkg
  run_pa "$c500.polyarch.yaml" >/dev/null
  run_buildx "$c500" "$host/ctx/buildx" "amd64 arm64" >/dev/null
  for ((i = 1; i <= RUNS; i++)); do
    change_pkg
    add ctx-polyarch "$(run_pa "$c500.polyarch.yaml")" "$i"
    change_pkg
    add ctx-buildx "$(run_buildx "$c500" "$host/ctx/buildx" "amd64 arm64")" "$i"
    # polyarch as buildx records builds: in BuildKit's build history
    change_pkg
    add ctx-polyarch-history "$(run_pa "$c500.polyarch.yaml" --build-history)" "$i"
  done

  # many images: NIMG small images x 2 platforms in one project / one bake file, cold;
  # and polyarch's time for one such image
  # make_many DIR PREFIX: NIMG fresh contexts, DIR.polyarch.yaml, DIR/docker-bake.hcl;
  # sets many_tags (buildx's tags)
  make_many() {
    local dir="$1" pre="$2" j targets=""
    mkdir -p "$dir"
    printf 'version: 1\nbinfmt: %s\nimages:\n' "$BINFMT" >"$dir.polyarch.yaml"
    : >"$dir/docker-bake.hcl"
    many_tags=()
    for ((j = 0; j < NIMG; j++)); do
      make_small "$dir/img$j"
      project_image "img$j" "$dir/img$j" "$host/$pre-pa/img$j" "linux/amd64, linux/arm64" >>"$dir.polyarch.yaml"
      cat >>"$dir/docker-bake.hcl" <<HCL
target "img$j" {
  context = "$dir/img$j"
  platforms = ["linux/amd64", "linux/arm64"]
  tags = ["$host/$pre-bx/img$j:t"]
  network = "none"
}
HCL
      targets+="${targets:+, }\"img$j\""
      many_tags+=("$host/$pre-bx/img$j:t")
    done
    printf 'group "default" {\n  targets = [%s]\n}\n' "$targets" >>"$dir/docker-bake.hcl"
  }
  use_cache many
  for ((i = 1; i <= RUNS; i++)); do
    # Each contender gets contexts of its own: identical ones would let the second hit
    # BuildKit's cache of the first one's steps.
    d="$tmp/many-$i"
    make_many "$d-pa" "many-$i"
    sync
    add many-polyarch "$(run_pa "$d-pa.polyarch.yaml")" "$i"
    make_many "$d-bx" "many-$i"
    sync
    add many-bake "$(run_bake "$d-bx/docker-bake.hcl" "${many_tags[@]}")" "$i"
    d="$tmp/one-$i"
    make_small "$d"
    printf 'version: 1\nbinfmt: %s\nimages:\n' "$BINFMT" >"$d.polyarch.yaml"
    project_image img0 "$d" "$host/one-$i/img0" "linux/amd64, linux/arm64" >>"$d.polyarch.yaml"
    sync
    add one-polyarch "$(run_pa "$d.polyarch.yaml")" "$i"
  done
  overheads c26
fi

if [[ $on28 == 1 ]]; then
  # ================================================================ Docker 28.5
  PA_ENGINE=28 PA_HOST="$H28" BX=d28
  log "28.5 warm-up: polyarch build (emulation memory for this engine), buildx build"
  warmup
  make_ctx "$tmp/warmup-bx28"
  qemu_ok || ensure_qemu
  run_buildx "$tmp/warmup-bx28" "$host/warmup/buildx28" "amd64 arm64" >/dev/null
  use_cache c28
  for ((i = 1; i <= RUNS; i++)); do
    fresh_cache "$D28BIN"
    for c in $(in_turn "$i" polyarch buildx); do
      key="c28-$c-2p"
      cold "$c" "$key" "$tmp/$key-$i" "$host/$key-$i/x" "amd64 arm64" "$i"
      warm "$c" "c28-$c-warm" "$tmp/$key-$i" "$host/$key-$i/x" "amd64 arm64" "$i"
    done
  done
  overheads c28
  BX=d26
fi

if [[ $onpm == 1 ]]; then
  # ================================================================ Podman 4.3
  PA_ENGINE=podman PA_HOST="$HPM"
  log "Podman warm-up: polyarch build (emulation memory for this engine), podman build"
  warmup
  make_ctx "$tmp/warmup-pm"
  qemu_ok || ensure_qemu
  run_podman "$tmp/warmup-pm" "$host/warmup/podman" "amd64 arm64" >/dev/null
  use_cache cpm
  for ((i = 1; i <= RUNS; i++)); do
    for c in $(in_turn "$i" polyarch podman); do
      key="cpm-$c-2p"
      cold "$c" "$key" "$tmp/$key-$i" "$host/$key-$i/x" "amd64 arm64" "$i"
      warm "$c" "cpm-$c-warm" "$tmp/$key-$i" "$host/$key-$i/x" "amd64 arm64" "$i"
    done
  done
fi

for k in "${!T[@]}"; do
  # shellcheck disable=SC2086
  M[$k]=$(median ${T[$k]})
done

# ------------------------------------------------------------------ figures
# rows: key|engine|figure|polyarch|contender name|contender|target
rows=()
row() { rows+=("$1|$2|$3|$4|$5|$6|$7"); }
if [[ $on20 == 1 ]]; then
  row c20-2p "Docker $engine_version" "cold build+push+verify, 2 platforms" "${M[c20-polyarch-2p]}" "classic CLI" "${M[c20-classic-2p]}" 0.5
  row c20-warm "Docker $engine_version" "warm no-change rerun, 2 platforms" "${M[c20-polyarch-warm]}" "classic CLI" "${M[c20-classic-warm]}" 0.2
  row c20-1p "Docker $engine_version" "cold build+push+verify, 1 platform" "${M[c20-polyarch-1p]}" "classic CLI" "${M[c20-classic-1p]}" 0.7
  row verify "Docker $engine_version" "verify-only, 2-platform tag" "${M[v-pa]}" "skopeo inspect --raw" "${M[v-sk]}" 0.8
fi
if [[ $on26 == 1 ]]; then
  row c26-2p "Docker $engine26_version" "cold build+push+verify, 2 platforms" "${M[c26-polyarch-2p]}" "buildx $buildx_version" "${M[c26-buildx-2p]}" 0.8
  row c26-warm "Docker $engine26_version" "warm no-change rerun, 2 platforms" "${M[c26-polyarch-warm]}" "buildx $buildx_version" "${M[c26-buildx-warm]}" 0.15
  row ctx "Docker $engine26_version" "${CTX_MB} MB context, changed package.json, 2 platforms" "${M[ctx-polyarch]}" "buildx $buildx_version" "${M[ctx-buildx]}" 0.4
  row many "Docker $engine26_version" "$NIMG images × 2 platforms, cold" "${M[many-polyarch]}" "buildx bake" "${M[many-bake]}" 0.85
  row many1 "Docker $engine26_version" "$NIMG images ÷ 1 image (polyarch, cold)" "${M[many-polyarch]}" "polyarch, 1 image" "${M[one-polyarch]}" 4.0
fi
if [[ $on28 == 1 ]]; then
  row c28-2p "Docker $engine28_version" "cold build+push+verify, 2 platforms" "${M[c28-polyarch-2p]}" "buildx $buildx28_version" "${M[c28-buildx-2p]}" 0.8
  row c28-warm "Docker $engine28_version" "warm no-change rerun, 2 platforms" "${M[c28-polyarch-warm]}" "buildx $buildx28_version" "${M[c28-buildx-warm]}" 0.15
fi
if [[ $onpm == 1 ]]; then
  # issue 41's targets: cold at most 0.8x the Podman workflow; a warm rerun at most 0.1x
  # of that workflow's cold run (and, against its own warm rerun on Podman's layer
  # cache, at most 0.5x)
  row cpm-2p "Podman $podman_version" "cold build+push+verify, 2 platforms" "${M[cpm-polyarch-2p]}" "podman build --manifest + manifest push" "${M[cpm-podman-2p]}" 0.8
  row cpm-warm-cold "Podman $podman_version" "warm no-change rerun ÷ the Podman workflow's cold run" "${M[cpm-polyarch-warm]}" "podman build --manifest + manifest push, cold" "${M[cpm-podman-2p]}" 0.1
  row cpm-warm "Podman $podman_version" "warm no-change rerun, 2 platforms" "${M[cpm-polyarch-warm]}" "podman build --manifest + manifest push" "${M[cpm-podman-warm]}" 0.5
fi
declare -A R V
failed=()
for r in "${rows[@]}"; do
  IFS='|' read -r key _ _ a _ b tgt <<<"$r"
  R[$key]=$(ratio "$a" "$b")
  V[$key]=$(passfail "${R[$key]}" "$tgt")
  [[ ${V[$key]} == FAIL ]] && failed+=("$key")
done

# ------------------------------------------------------------------ profiles of misses
if [[ $PROFILE == 1 ]]; then
  for key in "${failed[@]}"; do
    log "profile: $key (target missed)"
    case "$key" in
      c20-2p | c20-1p | c20-warm)
        PA_ENGINE=20 PA_HOST="$H20"
        use_cache "prof-$key"
        d="$tmp/prof-$key"
        make_ctx "$d"
        ensure_qemu
        plats="amd64 arm64"
        [[ $key == c20-1p ]] && plats=amd64
        write_project "$d" "$host/prof-$key/x" "$(plats_of "$plats")"
        [[ $key == c20-warm ]] && run_pa "$d.polyarch.yaml" >/dev/null
        profile_run "$key" "$d.polyarch.yaml"
        if [[ $key == c20-warm ]]; then
          P[$key]+=$'\n\n'"$(syscall_profile "$key" "$bin" build -f "$d.polyarch.yaml" --quiet)"
        fi
        ;;
      verify)
        PA_ENGINE=20 PA_HOST="$H20" PA_CACHE="$tmp/cache/c20"
        P[$key]="\`skopeo inspect --raw\` sends 2 requests (the \`/v2/\` ping and the index) and reads no certificates for a plain-HTTP registry. $(syscall_profile "$key" "$bin" verify "$ref" --platform linux/amd64,linux/arm64 --quiet)"
        ;;
      c26-2p | c26-warm)
        PA_ENGINE=26 PA_HOST="$H26"
        use_cache "prof-$key"
        d="$tmp/prof-$key"
        make_ctx "$d"
        ensure_qemu
        write_project "$d" "$host/prof-$key/x" "linux/amd64, linux/arm64"
        [[ $key == c26-warm ]] && run_pa "$d.polyarch.yaml" >/dev/null
        profile_run "$key" "$d.polyarch.yaml"
        if [[ $key == c26-2p ]]; then
          # the contender's own account of the same work, for comparison
          make_ctx "$d-bx"
          t0=$(now)
          if d26 buildx build --progress=plain --platform linux/amd64,linux/arm64 --provenance=false --network none \
            --push -t "$host/prof-c26-bx/x:t" "$d-bx" </dev/null >"$tmp/prof-buildx.log" 2>&1; then
            s_bx=$(since "$t0")
            P[$key]+=$'\n\n'"For comparison, one cold buildx run of the same kind with \`--progress=plain\` ($(fmt "$s_bx")s), from its export on:"$'\n\n```\n'"$(sed -n '/exporting to image/,$p' "$tmp/prof-buildx.log" | grep -E 'exporting (to image|layers)|unpacking|pushing (layers|manifest)|DONE|with docker' | grep -v -E 'pushing layer [0-9a-f]+' | head -n 20)"$'\n```'
          fi
        fi
        if [[ $key == c26-warm ]]; then
          P[$key]+=$'\n\n'"$(syscall_profile "$key" "$bin" build -f "$d.polyarch.yaml" --quiet)"
        fi
        ;;
      ctx)
        PA_ENGINE=26 PA_HOST="$H26" PA_CACHE="$tmp/cache/ctx"
        change_pkg
        profile_run "$key" "$c500.polyarch.yaml"
        P[$key]+=$'\n\n'"$(SP_PREP=change_pkg syscall_profile "$key" "$bin" build -f "$c500.polyarch.yaml" --quiet)"
        ;;
      many | many1)
        if [[ -z "${P[many-run]:-}" ]]; then
          PA_ENGINE=26 PA_HOST="$H26"
          use_cache "prof-many"
          d="$tmp/prof-many"
          make_many "$d" prof-many
          profile_run many-run "$d.polyarch.yaml"
          # what bounds it: the same cold build with every unit allowed to run at once
          jn=$((2 * NIMG))
          make_many "$d-j" prof-many-j
          PROFILE_BRIEF=1 profile_run many-j "$d-j.polyarch.yaml" -j "$jn"
          P[many-run]+=$'\n\n'"One more cold $NIMG-image run, profiled the same way, with \`-j $jn\` (every image × platform allowed at once instead of the default 2; default \`-j 2\`: median $(fmt "${M[many-polyarch]}")s, buildx bake: $(fmt "${M[many-bake]}")s): ${P[many-j]}"
          P[$key]="${P[many-run]}"
        else
          P[$key]="(the profile above)"
        fi
        ;;
    esac
  done
fi
# token auth: fetches and requests per push against a token-auth registry (bench/tokens.sh)
log "token auth: 2 images x 2 platforms, polyarch vs buildx bake"
tokens_table="$(DOCKER_HOST="$H20" TOKENS_BUILDX=$on26 bash "$root/bench/tokens.sh" "$bin" 2>"$tmp/tokens.err")" \
  || { tokens_table="(failed: $(tail -n 3 "$tmp/tokens.err" | tr '\n' ' '))"; log "token figures failed"; }
elapsed=$(($(date +%s) - started))

# ------------------------------------------------------------------ report
results="$root/bench/results.md"
table() {
  echo "| engine | figure | polyarch | contender | contender time | ratio | target | |"
  echo "| --- | --- | ---: | --- | ---: | ---: | --- | --- |"
  for r in "${rows[@]}"; do
    IFS='|' read -r key eng fig a cname b tgt <<<"$r"
    echo "| $eng | $fig | $(fmt "$a")s | $cname | $(fmt "$b")s | ${R[$key]}× | ≤ ${tgt}× | ${V[$key]} |"
  done
}
{
  echo "# polyarch benchmark"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'); nproc: $(nproc) (shared with other jobs; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
  [[ $on20 == 1 ]] && echo "- Docker $engine_version ($engine_driver storage, classic image store) at $H20; classic client: $DOCKER $("$DOCKER" version --format '{{.Client.Version}}')"
  [[ $on26 == 1 ]] && echo "- Docker $engine26_version (containerd image store: $engine26_driver) at $H26 (scripts/engine26.sh); buildx $buildx_version, default \`docker\` driver"
  [[ $on28 == 1 ]] && echo "- Docker $engine28_version (containerd image store) at $H28 (scripts/engine28.sh); buildx $buildx28_version, default \`docker\` driver, the same commands as on 26.1"
  [[ $onpm == 1 ]] && echo "- Podman $podman_version at $HPM (scripts/podman.sh, rootful \`podman system service\`): polyarch builds all platforms in one libpod build (\`/libpod/build\`) and exports and pushes each; the contender is \`podman build -q --network none --platform linux/amd64,linux/arm64 --manifest LIST DIR\` + \`podman manifest push --all LIST docker://REG/x:t\` + \`skopeo inspect --raw\` (its warm rerun: the same commands again, on Podman's layer cache)"
  echo "- polyarch: $(git -C "$root" rev-parse --short HEAD)$([[ -n "$(git -C "$root" status --porcelain -- src Cargo.toml Cargo.lock)" ]] && echo ' + uncommitted changes in the working tree') ($("$bin" --version 2>/dev/null || echo '?')), release build"
  echo "- runs per figure: $RUNS (median); verify-only: $VRUNS runs each (hyperfine median); total bench time ${elapsed}s"
  echo
  echo "## Results"
  echo
  table
  if [[ $on26 == 1 ]]; then
    echo
    echo "Tests before the tag moves (issue 37), Docker $engine26_version: \`test: {run: [/bin/busybox, \"true\"]}\` on both platforms against plain polyarch runs, each right beside one with it, in turn, $PAIRS pairs (added: the median over the iterations of the difference between the two runs of one pair; without it: the median of those plain runs):"
    echo
    echo "| figure | with test: | without | added | target | |"
    echo "| --- | ---: | ---: | ---: | --- | --- |"
    for f in 2p:cold:0.5 warm:warm:0.05; do
      IFS=: read -r k name tgt <<<"$f"
      added=$(fmt "$(paired "c26-tested-$k" "c26-plain_tested-$k")")
      echo "| $name, 2 platforms | $(fmt "${M[c26-tested-$k]:-}")s | $(fmt "${M[c26-plain_tested-$k]:-}")s | ${added}s | ≤ ${tgt}s | $(passfail "$added" "$tgt") |"
    done
    echo
    echo "SBOMs and signatures (issue 38), Docker $engine26_version: \`--sbom --sign-key KEY\` against plain polyarch runs, each right beside one with them, in turn, $PAIRS pairs, with the fixture's cosign key (\`COSIGN_PASSWORD\`; its scrypt, N = 65536 over 64 MiB, takes ${scrypt_s} s of CPU on this machine by itself, idle, in OpenSSL (polyarch's RustCrypto scrypt took 0.72 of OpenSSL's time where both were measured), opened at the lowest priority beside the build) and with a PKCS#8 P-256 PEM key (no key derivation) (added: the median over the iterations of the difference between the two runs of one pair):"
    echo
    echo "| figure | key | with --sbom --sign-key | without | added | target | |"
    echo "| --- | --- | ---: | ---: | ---: | --- | --- |"
    for f in 2p:cold:0.15 warm:warm:0.05; do
      IFS=: read -r k name tgt <<<"$f"
      for key in "attested:cosign.key (scrypt)" "attested_pem:PKCS#8 PEM"; do
        c=${key%%:*}
        added=$(fmt "$(paired "c26-$c-$k" "c26-plain_$c-$k")")
        echo "| $name, 2 platforms | ${key#*:} | $(fmt "${M[c26-$c-$k]:-}")s | $(fmt "${M[c26-plain_$c-$k]:-}")s | ${added}s | ≤ ${tgt}s | $(passfail "$added" "$tgt") |"
      done
    done
  fi
  if [[ $on20 == 1 ]]; then
    echo
    echo "Docker $engine_version, not targeted:"
    echo
    echo "| figure | polyarch | classic CLI | ratio |"
    echo "| --- | ---: | ---: | ---: |"
    echo "| 2-platform ÷ 1-platform (cold) | $(ratio "${M[c20-polyarch-2p]}" "${M[c20-polyarch-1p]}")× | $(ratio "${M[c20-classic-2p]}" "${M[c20-classic-1p]}")× | – |"
    if ((BIG_MB > 0)); then
      echo "| ${BIG_MB} MiB layer build+export+push, wall | $(fmt "$big_wall")s | $(fmt "$big_classic")s | $(ratio "$big_wall" "$big_classic")× |"
      echo "| ${BIG_MB} MiB layer, polyarch's peak RSS (≤ 64 MiB: $(awk -v r="$big_rss_mib" 'BEGIN { print (r <= 64) ? "PASS" : "FAIL" }')) | ${big_rss_mib} MiB | – | – |"
      echo "| ${BIG_MB} MiB layer, rebuilt with --sbom (its SBOM made from the layer read back), wall | $(fmt "$big_sbom_wall")s | – | – |"
      echo "| ${BIG_MB} MiB layer, --sbom, polyarch's peak RSS (≤ 64 MiB: $(awk -v r="$big_sbom_rss_mib" 'BEGIN { print (r != "" && r <= 64) ? "PASS" : "FAIL" }')) | ${big_sbom_rss_mib} MiB | – | – |"
    fi
    if ((SYNC_GB > 0)); then
      echo "| ${SYNC_GB} GiB context served by file sync, wall | $(fmt "$sync_wall")s | – | – |"
      echo "| ${SYNC_GB} GiB context, polyarch's peak RSS (≤ 64 MiB: $(awk -v r="$sync_rss_mib" 'BEGIN { print (r <= 64) ? "PASS" : "FAIL" }')) | ${sync_rss_mib} MiB | – | – |"
    fi
  fi
  if [[ $on26 == 1 || $on28 == 1 ]]; then
    echo
    echo "polyarch's own time outside the engine's solve and push (medians of $RUNS more cold 2-platform runs, each followed by its warm rerun; start-up: process start to BuildKit's first step status; tail: the last platform pushed to exit; polyarch's part of the start-up: process start to the first build phase, right before the session opens and the solve is sent, the rest being BuildKit's frontend before its first status):"
    echo
    echo "| engine | start-up | tail | cold total (≤ 0.10 s) | | warm rerun, all of it (≤ 0.05 s) | | start-up: polyarch's part | polyarch's part + tail (≤ 0.10 s) | |"
    echo "| --- | ---: | ---: | ---: | --- | ---: | --- | ---: | ---: | --- |"
    for e in 26 28; do
      [[ -n "${M[oh-c$e-warm]:-}" ]] || continue
      echo "| Docker $([[ $e == 26 ]] && echo "$engine26_version" || echo "$engine28_version") | $(fmt "${M[oh-c$e-start]:-}")s | $(fmt "${M[oh-c$e-tail]:-}")s | $(fmt "${M[oh-c$e-cold]:-}")s | $(passfail "${M[oh-c$e-cold]:-n/a}" 0.10) | $(fmt "${M[oh-c$e-warm]}")s | $(passfail "${M[oh-c$e-warm]}" 0.05) | $(fmt "${M[oh-c$e-own]:-}")s | $(fmt "${M[oh-c$e-owncold]:-}")s | $(passfail "${M[oh-c$e-owncold]:-n/a}" 0.10) |"
    done
  fi
  echo
  echo "Registry round trips against a token-auth registry (docker-registry \`auth: token\`, tests/support/token-server.py; one run each, counted from the token server's and registry's logs):"
  echo
  echo "$tokens_table"
  echo
  echo "Raw seconds per run:"
  echo
  for k in $(printf '%s\n' "${!T[@]}" | sort); do echo "- $k: ${T[$k]}"; done
  echo
  echo "## Method"
  echo
  echo "- Registry: a throw-away CNCF distribution registry (Debian \`docker-registry\`) on 127.0.0.1:$registry_port, plain HTTP, data in the bench's temp dir; every figure uses its own repositories."
  echo "- Fixture of the cold and warm figures (generated per run): \`FROM scratch\`, \`COPY nonce /nonce\`, static Debian busybox per arch (\`COPY bin/\${TARGETARCH}/busybox /bin/busybox\`), \`RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\` (arm64 runs under QEMU), \`COPY blob /blob\` with 20 MB from /dev/urandom. RUN steps get network \`none\` from every contender."
  echo "- Cold runs: each run of each contender gets a new context (fresh nonce as the first step, fresh random blob) and a new repository, so the build cache misses from the first step on and the registry has none of the layers. The base is \`scratch\`, so nothing else could be cached. Each run leaves the engine a little slower for the next (a growing build cache and image store), so the contenders take turns: in the order listed on odd iterations, reversed on even ones; the build caches of Docker 26.1 and 28.5 (the bench's own engines) are emptied before each iteration of their loops, that of Docker 20.10 (the machine's, shared) is not. Before each timed run (every contender) the bench runs \`sync\`, untimed, so no run pays for writing back the pages an earlier run, or the making of its context, left dirty, then waits (at most 3 s) until the CPUs were 90 % idle over 0.1 s, so none pays for the engine's background work after the run before it."
  echo "- Warm runs: the same contender's cold context, repository and tag again, unchanged, right after the cold run."
  echo "- polyarch: \`polyarch build -f polyarch.yaml --record record.json --quiet\` (default -j 2; builds through the engine's BuildKit session API, exports, pushes, publishes the index, reads it back and checks every entry's manifest and config, writes the record), \`DOCKER_HOST\` set to the engine. Each figure has its own \`POLYARCH_CACHE_DIR\`, seeded only with the emulation memory (\`emulation.json\`: which emulators the engine's kernel has) of an untimed warm-up build on the same engine, never with build or push memory; warm runs use the memory their own cold run left."
  if [[ $on20 == 1 ]]; then
    echo "- Classic CLI on Docker $engine_version, 2 platforms: per arch \`DOCKER_BUILDKIT=1 docker build --platform linux/\$arch -t REG/x:t-\$arch\` + \`docker push\`, sequentially; then \`docker manifest create --amend --insecure REG/x:t REG/x:t-amd64 REG/x:t-arm64\`, \`docker manifest push --purge --insecure\`, \`skopeo inspect --raw\` as the verify step. 1 platform: \`docker build\` + \`docker push\` of the tag itself + \`skopeo inspect --raw\`."
    [[ -n "$classic_note" ]] && echo "- $classic_note"
    echo "- Verify-only: \`hyperfine -N --warmup 2 --runs $VRUNS\` of \`polyarch verify REF --platform linux/amd64,linux/arm64\` vs \`skopeo inspect --raw --tls-verify=false docker://REF\` (skopeo only fetches the index; polyarch also fetches each platform's manifest and config)."
    ((BIG_MB > 0)) && echo "- Big layer: \`FROM scratch\` + \`COPY big /big\`, ${BIG_MB} MiB of AES-128-CTR keystream (\`openssl enc\` of /dev/zero; incompressible, generated in ${gen_s}s), built with polyarch under \`/usr/bin/time -v\` (wall and max RSS of the polyarch process; the engine's and registry's memory is not counted). Classic reference: \`docker build\` + \`docker push\` once."
  fi
  if [[ $on26 == 1 ]]; then
    echo "- buildx on Docker $engine26_version: \`docker buildx build -q --platform linux/amd64,linux/arm64 --provenance=false --network none --push -t REG/x:t DIR\` (the default \`docker\` driver; on the containerd image store it builds both platforms in one solve and pushes one index), then \`skopeo inspect --raw --tls-verify=false docker://REG/x:t\` as its \"+verify\": the same read-back of the tag the classic workflow gets. It is less than polyarch's verify (the index only, not each entry's manifest and config), so the comparison favours buildx slightly (a read-back costs ~10–20 ms here). A private \`DOCKER_CONFIG\` holds buildx 0.13.1 as a CLI plugin."
    echo "- BuildKit's build history: buildx records every build in it (\`docker buildx history\`); polyarch does not unless \`--build-history\` is given (the solve is marked internal), which spares the engine writing the record and its provenance after the push. The ${CTX_MB} MB context figure with \`--build-history\`, timed in the same loop: $(fmt "${M[ctx-polyarch-history]:-}")s, $(ratio "${M[ctx-polyarch-history]:-}" "${M[ctx-buildx]:-}")× buildx."
    echo "- ${CTX_MB} MB context: \`node_modules/\` with $ctx_count files (1 000 package directories of 20 files of 25 kB random data each, ${ctx_du} MiB on disk, made once in ${ctx_gen_s}s by bench/gen-node-modules.py and shared by both contenders), \`package.json\`, and a Dockerfile \`FROM scratch\` + \`COPY package.json /\`; no .dockerignore. Each contender builds it once untimed; every timed run first writes a new package.json, then builds both platforms, pushes (to the same repository and tag each time, as a user's rebuild does) and reads back."
    echo "- $NIMG images: per run $NIMG fresh contexts (\`FROM scratch\`, \`COPY nonce\`, busybox per arch, \`COPY data /data\` with 1 MB of its own random data, no RUN), each its own repository. polyarch: one polyarch.yaml listing all $NIMG, one \`polyarch build\`. buildx: a generated docker-bake.hcl with the same $NIMG targets (\`context\`, \`platforms = [\"linux/amd64\", \"linux/arm64\"]\`, \`tags\`, \`network = \"none\"\`, one group), \`docker buildx bake -f docker-bake.hcl --provenance=false --push\`, then \`skopeo inspect --raw\` of each of the $NIMG tags. polyarch's 1-image figure: the same kind of image alone in its own project, cold."
  fi
  echo "- QEMU: before the bench: $bf_found. An untimed polyarch warm-up build with \`binfmt: auto\` registers qemu-aarch64 on the kernel when it is missing; the classic CLI and buildx cannot register it and rely on that. At exit the bench removes the entry it added and unmounts binfmt_misc if it mounted it.${binfmt_line:+ polyarch said: \`${binfmt_line}\`}$([[ $reregistered == 1 ]] && echo ' The registration vanished during the bench (another job cleaned up) and was made again before the next run.')"
  [[ -n "$run_note" ]] && echo "- **$run_note**"
  if ((${#failed[@]})) && [[ $PROFILE == 1 ]]; then
    echo
    echo "## Profiles of the missed targets"
    echo
    echo "One more polyarch run of each missed figure, set up as in its timed runs, with \`--output-format json\`: each JSON progress line on stderr is stamped on arrival by bench/stamp.py and bench/phases.py turns the stamps into per-phase times (a unit is an image × platform; a phase lasts from the unit's entry into it to its next phase)."
    for key in "${failed[@]}"; do
      [[ -n "${P[$key]:-}" ]] || continue
      for r in "${rows[@]}"; do
        IFS='|' read -r k eng fig _ <<<"$r"
        [[ $k == "$key" ]] && { echo; echo "### $eng: $fig"; }
      done
      echo
      echo "${P[$key]}"
    done
  fi
  if [[ -f "$root/bench/analysis.md" ]]; then echo; cat "$root/bench/analysis.md"; fi
} >"$results"

# ------------------------------------------------------------------ print
echo
table
echo "wrote $results (${elapsed}s)"
