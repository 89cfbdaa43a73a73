#!/usr/bin/env bash
# `make bench`: polyarch against the classic docker CLI workflow, on the same engine
# and a fresh loopback registry. Prints medians and ratios and writes bench/results.md.
#
#   BENCH_RUNS=N       runs per figure (default 3; median reported)
#   BENCH_VERIFY_RUNS  runs of each verify-only command (default 10)
#   BENCH_BIG_MB       size of the big layer in MiB (default 1024)
#   BENCH_BIG_CLASSIC  1 (default) also time docker build+push of the big layer once
#   BENCH_KEEP=1       keep the temp dir (logs, contexts, registry data)
#
# Fairness (see results.md): every cold run gets a fresh nonce file as the first
# Dockerfile step (so every later step misses the build cache, for both contenders,
# without pruning the engine's cache, which other users share), a fresh 20 MB random
# blob (so no layer can be deduplicated by the registry) and a fresh repository.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ -f "$HOME/.cargo/env" ]]; then source "$HOME/.cargo/env"; fi
log() { printf 'bench: %s\n' "$*" >&2; }

RUNS="${BENCH_RUNS:-3}"
VRUNS="${BENCH_VERIFY_RUNS:-10}"
BIG_MB="${BENCH_BIG_MB:-1024}"
BIG_CLASSIC="${BENCH_BIG_CLASSIC:-1}"
started=$(date +%s)

# ------------------------------------------------------------------ prerequisites
# The engine, registry and clients come from the environment script the tests use; the
# bench's own tools are installed here when missing (as root), like everything else.
bash scripts/ensure-env.sh
missing=()
for tool in hyperfine:hyperfine time:time strace:strace openssl:openssl curl:curl; do
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
log "cargo build --release"
cargo build --release -q
bin="$root/target/release/polyarch"

# The classic workflow needs a client whose `docker build` speaks BuildKit. Docker
# CLI >= 23 delegates that to the buildx plugin; without it, DOCKER_BUILDKIT=1 fails
# and the legacy builder cannot build FROM scratch for a foreign platform. A 20.10
# client (Debian's docker.io) still has BuildKit built in, so prefer it then.
classic_note=""
if docker buildx version >/dev/null 2>&1; then
  DOCKER=docker
  have_buildx=1
else
  have_buildx=0
  DOCKER=""
  for c in $(which -a docker | awk '!seen[$0]++'); do
    v="$("$c" version --format '{{.Client.Version}}' 2>/dev/null || true)"
    if [[ "${v%%.*}" =~ ^[0-9]+$ && "${v%%.*}" -lt 23 ]]; then DOCKER="$c"; break; fi
  done
  [[ -n "$DOCKER" ]] || { log "no docker client can run DOCKER_BUILDKIT=1 docker build (no buildx, no client < 23)"; exit 1; }
  classic_note="buildx is not installed, so \`DOCKER_BUILDKIT=1 docker build\` fails with the default client ($(docker version --format '{{.Client.Version}}')); the classic workflow uses $DOCKER ($("$DOCKER" version --format '{{.Client.Version}}'), BuildKit built in)."
fi
export DOCKER_BUILDKIT=1 DOCKER_CLI_EXPERIMENTAL=enabled
engine_version="$(docker version --format '{{.Server.Version}}')"

# ------------------------------------------------------------------ temp + registry
tmp="$(mktemp -d -t polyarch-bench.XXXXXX)"
reg_pid=""
host=""
cleanup() {
  set +e
  if stop_registry; then
    log "registry stopped"
  fi
  if [[ -n "$host" ]]; then # images this run tagged in the engine (nothing else)
    docker images --format '{{.Repository}}:{{.Tag}}' | grep -F "$host/" | xargs -r docker image rm -f >/dev/null 2>&1
  fi
  if [[ "${BENCH_KEEP:-}" == 1 ]]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=../scripts/registry.sh
source "$root/scripts/registry.sh"
start_registry warn && host="127.0.0.1:$registry_port"
[[ -n "$host" ]] || { log "could not start docker-registry"; exit 1; }
log "registry at http://$host (pid $reg_pid); temp $tmp"

# ------------------------------------------------------------------ fixture
WITH_RUN=1 BINFMT=auto run_note=""
# make_ctx DIR: FROM scratch, busybox per arch, RUN under QEMU for arm64, 20 MB blob.
# RUN steps use no network for both contenders: a hand-started engine may have no bridge.
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
# write_project DIR REPO PLATFORMS -> DIR/polyarch.yaml
# (project file and record live beside the context, not in it)
write_project() {
  cat >"$1.polyarch.yaml" <<YAML
version: 1
binfmt: $BINFMT
images:
  x:
    repository: $2
    tags: [t]
    context: $1
    platforms: [$3]
    network: none
YAML
}

now() { date +%s.%N; }
# median of the arguments
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
fmt() { awk -v a="$1" 'BEGIN { printf "%.2f", a }'; }
passfail() { awk -v v="$1" -v t="$2" 'BEGIN { print (v != "n/a" && v <= t) ? "PASS" : "FAIL" }'; }

# Each contender: run_X DIR REPO PLATFORMS(arch list) -> prints elapsed seconds.
run_polyarch() { # DIR REPO "amd64 arm64"
  local dir="$1" repo="$2" plats="" a t0 t1
  for a in $3; do plats+="${plats:+, }linux/$a"; done
  write_project "$dir" "$repo" "$plats"
  t0=$(now)
  "$bin" build -f "$dir.polyarch.yaml" --record "$dir.record.json" --quiet \
    >>"$tmp/polyarch.out" 2>>"$tmp/polyarch.err" </dev/null \
    || { log "polyarch build failed (see below)"; tail -n 8 "$tmp/polyarch.err" >&2; return 1; }
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}
run_classic() { # DIR REPO "amd64 arm64"
  local dir="$1" repo="$2" a t0 t1 refs=()
  t0=$(now)
  {
    if [[ "$3" == *" "* ]]; then
      for a in $3; do
        "$DOCKER" build -q --network none --platform "linux/$a" -t "$repo:t-$a" "$dir"
        "$DOCKER" push -q "$repo:t-$a"
        refs+=("$repo:t-$a")
      done
      "$DOCKER" manifest create --amend --insecure "$repo:t" "${refs[@]}"
      "$DOCKER" manifest push --purge --insecure "$repo:t"
    else # one platform: users push the tag itself, no manifest list
      "$DOCKER" build -q --network none --platform "linux/$3" -t "$repo:t" "$dir"
      "$DOCKER" push -q "$repo:t"
    fi
    skopeo inspect --raw --tls-verify=false "docker://$repo:t"
  } >>"$tmp/classic.out" 2>>"$tmp/classic.err" </dev/null \
    || { log "classic workflow failed"; tail -n 20 "$tmp/classic.err" >&2; return 1; }
  t1=$(now)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'
}

# ------------------------------------------------------------------ warm-up / binfmt
# polyarch --binfmt auto registers QEMU for arm64 on the engine's kernel; the classic
# docker CLI cannot, and relies on that registration. Not timed.
log "warm-up: polyarch build (registers binfmt for arm64), classic build"
make_ctx "$tmp/warmup"
if ! run_polyarch "$tmp/warmup" "$host/warmup/polyarch" "amd64 arm64" >/dev/null; then
  if grep -q 'emulation' "$tmp/polyarch.err"; then
    run_note="QEMU emulation could not be made to work on this engine (polyarch: \`$(grep -m1 '^error: emulation' "$tmp/polyarch.err" | cut -c1-400)\`), so the fixture has NO \`RUN\` step and projects use \`binfmt: never\`; neither contender can run an arm64 RUN here."
    log "emulation unavailable: dropping the RUN step, binfmt: never"
    WITH_RUN=0 BINFMT=never
    make_ctx "$tmp/warmup2"
    run_polyarch "$tmp/warmup2" "$host/warmup/polyarch2" "amd64 arm64" >/dev/null
  else
    exit 1
  fi
fi
binfmt_line="$(grep -i -m1 -E 'binfmt|emulat|qemu' "$tmp/polyarch.err" || true)"
make_ctx "$tmp/warmup-c"
run_classic "$tmp/warmup-c" "$host/warmup/classic" "amd64 arm64" >/dev/null

# ------------------------------------------------------------------ cold + warm
declare -A T
for ((i = 1; i <= RUNS; i++)); do
  for c in polyarch classic; do
    for plats in "amd64 arm64" "amd64"; do
      key="$c-$(wc -w <<<"$plats")p"
      d="$tmp/$key-$i"
      make_ctx "$d"
      s=$("run_$c" "$d" "$host/$key-$i/x" "$plats")
      T[$key]+="$s "
      log "cold $key run $i: ${s}s"
    done
    # warm: the same context, repository and tag again (nothing changed)
    d="$tmp/$c-2p-$i"
    s=$("run_$c" "$d" "$host/$c-2p-$i/x" "amd64 arm64")
    T[$c-warm]+="$s "
    log "warm $c run $i: ${s}s"
  done
done
declare -A M
for k in "${!T[@]}"; do
  # shellcheck disable=SC2086
  M[$k]=$(median ${T[$k]})
done

# ------------------------------------------------------------------ verify-only
ref="$host/polyarch-2p-1/x:t"
log "verify-only: $VRUNS runs each of polyarch verify / skopeo inspect --raw ($ref)"
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

# ------------------------------------------------------------------ big layer
log "big layer: ${BIG_MB} MiB of incompressible data (AES-CTR keystream)"
big="$tmp/big"
mkdir -p "$big"
printf 'FROM scratch\nCOPY big /big\n' >"$big/Dockerfile"
t0=$(now)
openssl enc -aes-128-ctr -nosalt -pass "pass:$RANDOM$RANDOM" -pbkdf2 </dev/zero 2>/dev/null \
  | head -c "$((BIG_MB * 1024 * 1024))" >"$big/big" || true # openssl dies of SIGPIPE
[[ "$(stat -c %s "$big/big")" == "$((BIG_MB * 1024 * 1024))" ]] || { log "could not generate the big file"; exit 1; }
gen_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
write_project "$big" "$host/big/polyarch" "linux/amd64"
/usr/bin/time -v -o "$tmp/big.time" \
  "$bin" build -f "$big.polyarch.yaml" --record "$big.record.json" -v \
  >"$tmp/big.out" 2>"$tmp/big.err" </dev/null \
  || { log "polyarch big build failed"; tail -n 20 "$tmp/big.err" >&2; exit 1; }
big_wall=$(awk -F': ' '/Elapsed \(wall clock\)/ { n = split($2, p, ":"); s = 0; for (i = 1; i <= n; i++) s = s * 60 + p[i]; printf "%.2f", s }' "$tmp/big.time")
big_rss_kb=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$tmp/big.time")
big_rss_mib=$(awk -v k="$big_rss_kb" 'BEGIN { printf "%.1f", k / 1024 }')
big_classic="n/a"
if [[ "$BIG_CLASSIC" == 1 ]]; then
  t0=$(now)
  { "$DOCKER" build -q -t "$host/big/classic:t" "$big" && "$DOCKER" push -q "$host/big/classic:t"; } \
    >>"$tmp/classic.out" 2>>"$tmp/classic.err" </dev/null && \
  big_classic=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
fi
rm -f "$big/big"

# ------------------------------------------------------------------ profile
# Where polyarch's cold 2-platform time goes: one more cold run with verbose plain
# output (non-TTY), every stderr line stamped with a sub-second clock.
log "profile: one cold 2-platform polyarch run with timestamped -v output"
prof="$tmp/profile"
make_ctx "$prof"
write_project "$prof" "$host/profile/x" "linux/amd64, linux/arm64"
p0=$(now)
"$bin" build -f "$prof.polyarch.yaml" --record "$prof.record.json" -v </dev/null 2>&1 >/dev/null \
  | while IFS= read -r line; do printf '%s %s\n' "$(now)" "$line"; done >"$tmp/profile.log"
prof_lines=$(awk -v t0="$p0" '{ printf "%7.2fs  %s\n", $1 - t0, substr($0, index($0, " ") + 1) }' "$tmp/profile.log")
# the largest gaps between consecutive lines: the phase that ended at each line
prof_gaps=$(awk -v t0="$p0" '{ d = $1 - prev; if (NR == 1) d = $1 - t0; prev = $1; printf "%.2f\t%s\n", d, substr($0, index($0, " ") + 1) }' \
  "$tmp/profile.log" | sort -t$'\t' -k1,1 -gr | head -n 8 | awk -F'\t' '{ printf "| %ss | `%s` |\n", $1, $2 }')
strace_summary=""
if command -v strace >/dev/null; then
  make_ctx "$prof-s"
  write_project "$prof-s" "$host/profile-s/x" "linux/amd64, linux/arm64"
  strace -f -c -o "$tmp/strace.txt" "$bin" build -f "$prof-s.polyarch.yaml" --quiet </dev/null >/dev/null 2>&1 || true
  strace_summary=$(head -n 14 "$tmp/strace.txt" 2>/dev/null || true)
fi

# ------------------------------------------------------------------ report
r_cold=$(ratio "${M[polyarch-2p]}" "${M[classic-2p]}")
r_cold1=$(ratio "${M[polyarch-1p]}" "${M[classic-1p]}")
r_warm=$(ratio "${M[polyarch-warm]}" "${M[classic-warm]}")
r_verify=$(ratio "$v_pa" "$v_sk")
r_pa21=$(ratio "${M[polyarch-2p]}" "${M[polyarch-1p]}")
r_cl21=$(ratio "${M[classic-2p]}" "${M[classic-1p]}")
rss_ok=$(awk -v r="$big_rss_mib" 'BEGIN { print (r <= 64) ? "PASS" : "FAIL" }')
elapsed=$(( $(date +%s) - started ))

results="$root/bench/results.md"
{
  echo "# polyarch benchmark"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- nproc: $(nproc); engine: Docker $engine_version ($(docker info --format '{{.Driver}}' 2>/dev/null) storage); classic client: $DOCKER $("$DOCKER" version --format '{{.Client.Version}}')"
  echo "- polyarch: $(git -C "$root" rev-parse --short HEAD) ($("$bin" --version 2>/dev/null || echo '?')), release build"
  echo "- runs per figure: $RUNS (median); verify-only: $VRUNS runs each (hyperfine median); total bench time ${elapsed}s"
  echo
  echo "## Results"
  echo
  echo "| figure | polyarch | classic | ratio | target | |"
  echo "| --- | ---: | ---: | ---: | --- | --- |"
  echo "| cold build+push+verify, 2 platforms | $(fmt "${M[polyarch-2p]}")s | $(fmt "${M[classic-2p]}")s | ${r_cold}× | ≤ 0.5× | $(passfail "$r_cold" 0.5) |"
  echo "| cold build+push+verify, 1 platform | $(fmt "${M[polyarch-1p]}")s | $(fmt "${M[classic-1p]}")s | ${r_cold1}× | – | |"
  echo "| warm no-change rerun, 2 platforms | $(fmt "${M[polyarch-warm]}")s | $(fmt "${M[classic-warm]}")s | ${r_warm}× | ≤ 0.5× | $(passfail "$r_warm" 0.5) |"
  echo "| verify-only, 2-platform tag (vs skopeo inspect --raw) | $(fmt "$v_pa")s | $(fmt "$v_sk")s | ${r_verify}× | ≤ 1.0× | $(passfail "$r_verify" 1.0) |"
  echo "| 2-platform ÷ 1-platform (cold) | ${r_pa21}× | ${r_cl21}× | – | – | |"
  echo "| ${BIG_MB} MiB layer export+push, wall | ${big_wall}s | ${big_classic}s | $(ratio "$big_wall" "$big_classic")× | – | |"
  echo "| ${BIG_MB} MiB layer export+push, peak RSS | ${big_rss_mib} MiB | – | – | ≤ 64 MiB | $rss_ok |"
  echo
  echo "Raw seconds per run:"
  echo
  for k in polyarch-2p classic-2p polyarch-1p classic-1p polyarch-warm classic-warm; do echo "- $k: ${T[$k]}"; done
  echo
  echo "## Method"
  echo
  echo "- Fixture (generated per run): \`FROM scratch\`, \`COPY nonce /nonce\`, static Debian busybox per arch (\`COPY bin/\${TARGETARCH}/busybox /bin/busybox\`), \`RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\` (arm64 runs under QEMU), \`COPY blob /blob\` with 20 MB from /dev/urandom."
  echo "- Cold runs: each run of each contender gets a new context (fresh nonce as the first step, fresh random blob) and a new repository, so the build cache misses from the first step on and the registry has none of the layers. The engine's build cache is not pruned (the engine is shared); the base is \`scratch\`, so nothing else could be cached."
  echo "- Warm runs: the same contender's cold context, repository and tag again, unchanged."
  echo "- polyarch: \`polyarch build -f polyarch.yaml --record record.json --quiet\` (default -j 2; builds, exports, pushes, reads the index back and writes the record)."
  echo "- classic, 2 platforms: per arch \`DOCKER_BUILDKIT=1 docker build --platform linux/\$arch -t REG/x:t-\$arch\` + \`docker push\`, sequentially; then \`docker manifest create --amend --insecure REG/x:t REG/x:t-amd64 REG/x:t-arm64\`, \`docker manifest push --purge --insecure\`, \`skopeo inspect --raw\` as the verify step. 1 platform: \`docker build\` + \`docker push\` of the tag itself + \`skopeo inspect --raw\`."
  [[ -n "$classic_note" ]] && echo "- $classic_note"
  [[ -n "$run_note" ]] && echo "- **$run_note**"
  echo "- QEMU: an untimed polyarch warm-up build with \`binfmt: auto\` registers qemu-aarch64 on the engine's kernel; the classic CLI cannot register it and relies on that. ${binfmt_line:+polyarch said: \`${binfmt_line}\`}"
  [[ "$have_buildx" == 0 ]] && echo "- buildx: not installed (\`docker buildx version\` fails), so no \`docker buildx build --platform linux/amd64,linux/arm64 --push\` contender."
  echo "- Verify-only: \`hyperfine -N --warmup 2 --runs $VRUNS\` of \`polyarch verify REF --platform linux/amd64,linux/arm64\` vs \`skopeo inspect --raw --tls-verify=false docker://REF\` (skopeo only fetches the index; polyarch also fetches each platform's manifest and config)."
  echo "- Big layer: \`FROM scratch\` + \`COPY big /big\`, ${BIG_MB} MiB of AES-128-CTR keystream (\`openssl enc\` of /dev/zero; incompressible, generated in ${gen_s}s), built with polyarch under \`/usr/bin/time -v\` (wall and max RSS of the polyarch process; the engine's and registry's memory is not counted). Classic reference: \`docker build\` + \`docker push\` once."
  echo
  echo "## Profile"
  echo
  echo "One extra cold 2-platform polyarch run with \`-v\` plain output (non-TTY), every stderr line stamped on arrival:"
  echo
  echo "Largest gaps (time spent before each line appeared):"
  echo
  echo "| gap | line |"
  echo "| ---: | --- |"
  echo "$prof_gaps"
  echo
  echo "<details><summary>full timeline</summary>"
  echo
  echo '```'
  echo "$prof_lines"
  echo '```'
  echo
  echo "</details>"
  echo
  echo "Big-layer run (\`-v\`), last lines:"
  echo
  echo '```'
  tail -n 25 "$tmp/big.err"
  echo '```'
  if [[ -n "$strace_summary" ]]; then
    echo
    echo "\`strace -f -c\` of one cold 2-platform polyarch run (top syscalls by time; mostly threads waiting):"
    echo
    echo '```'
    echo "$strace_summary"
    echo '```'
  fi
  if [[ -f "$root/bench/analysis.md" ]]; then echo; cat "$root/bench/analysis.md"; fi
} >"$results"

# ------------------------------------------------------------------ print
echo
sed -n '/^## Results/,/^Raw seconds/p' "$results" | sed '$d'
echo "wrote $results (${elapsed}s)"
