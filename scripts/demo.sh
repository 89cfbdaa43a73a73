#!/usr/bin/env bash
# `make demo`: build examples/hello for linux/amd64 + linux/arm64 with polyarch,
# push it to a throw-away loopback registry and print the coverage record.
#   1. scripts/ensure-env.sh demo (its tools, the machine's engine, busybox fixtures)
#   2. copy fixtures/busybox/<arch>/busybox into examples/hello/bin/ (gitignored)
#   3. start `docker-registry serve` on a free 127.0.0.1 port (temp storage)
#   4. write polyarch.yaml (repository host -> that registry, absolute context)
#   5. target/release/polyarch build -f … --record … --output-format json
#   6. print the record; the registry is stopped and the temp dir removed on exit
# Set POLYARCH_DEMO_KEEP=1 to keep the temp dir (record, registry log).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ -f "$HOME/.cargo/env" ]]; then source "$HOME/.cargo/env"; fi
log() { printf 'demo: %s\n' "$*" >&2; }

bash scripts/ensure-env.sh demo
bin="$root/target/release/polyarch"
if [[ ! -x "$bin" ]]; then cargo build --release; fi

# 2. build context
example="$root/examples/hello"
for a in amd64 arm64; do
  install -D -m 0755 "fixtures/busybox/$a/busybox" "$example/bin/$a/busybox"
done

# 3. registry
tmp="$(mktemp -d -t polyarch-demo.XXXXXX)"
reg_pid=""
cleanup() {
  if stop_registry; then
    log "registry stopped"
  fi
  if [[ "${POLYARCH_DEMO_KEEP:-}" == 1 ]]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

# shellcheck source=registry.sh
source "$root/scripts/registry.sh"
port=""
start_registry info && port="$registry_port"
[[ -n "$port" ]] || { log "could not start docker-registry"; exit 1; }
host="127.0.0.1:$port"
log "registry at http://$host (pid $reg_pid, log $tmp/registry.log)"

# 4. project file
sed -e "s#^\(\s*repository:\s*\)127\.0\.0\.1:5000/#\1$host/#" \
    -e "s#^\(\s*context:\s*\)\.\s*\$#\1$example#" \
    "$example/polyarch.yaml" >"$tmp/polyarch.yaml"
grep -q "$host/" "$tmp/polyarch.yaml" || { log "failed to rewrite repository"; exit 1; }
log "project file:"; sed 's/^/  /' "$tmp/polyarch.yaml" >&2

# 5. build + push + verify
record="$tmp/record.json"
log "$bin build -f $tmp/polyarch.yaml --record $record --output-format json"
"$bin" build -f "$tmp/polyarch.yaml" --record "$record" --output-format json

# 6. result
if [[ ! -s "$record" ]]; then
  log "polyarch wrote no coverage record to $record (is the build command implemented yet?)"
  exit 1
fi
echo "==== coverage record ($record)"
if command -v python3 >/dev/null; then python3 -m json.tool "$record"; else cat "$record"; echo; fi
echo "==== index in the registry (skopeo inspect --raw docker://$host/demo/hello:v1)"
skopeo inspect --raw --tls-verify=false "docker://$host/demo/hello:v1" || true
echo
