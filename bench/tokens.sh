#!/usr/bin/env bash
# Token fetches and registry requests of one push of 2 images x 2 platforms (a busybox
# layer both share, a small layer of each image's own) to a token-auth registry
# (docker-registry with `auth: token` and tests/support/token-server.py): polyarch on the
# machine's engine, buildx (`docker buildx bake`, Docker 26.1) on the same content.
# Prints one markdown table. Run by bench/run.sh; alone: `bash bench/tokens.sh POLYARCH`.
#   TOKENS_BUILDX=0   skip buildx (no Docker 26.1)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$1"
tmp="$(mktemp -d -t polyarch-tokens.XXXXXX)"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
log() { printf 'bench tokens: %s\n' "$*" >&2; }
user=benchuser pass=bench-Pa55-9c1d

openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 2 -subj /CN=bench-token-signer \
  -keyout "$tmp/signing.key" -out "$tmp/signing.crt" 2>/dev/null
python3 "$root/tests/support/token-server.py" --key "$tmp/signing.key" --cert "$tmp/signing.crt" \
  --log "$tmp/tokens.jsonl" --user "$user" --password "$pass" >"$tmp/token.port" &
pids+=($!)
for ((i = 0; i < 100; i++)); do [[ -s $tmp/token.port ]] && break; sleep 0.1; done
tport="$(head -n 1 "$tmp/token.port")"
[[ -n $tport ]] || { log "token server did not start"; exit 1; }

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for ((try = 0; try < 5; try++)); do
  port=$((20000 + RANDOM % 20000))
  port_in_use "$port" && continue
  cat >"$tmp/registry.yml" <<YAML
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $tmp/data
http:
  addr: 127.0.0.1:$port
auth:
  token:
    realm: http://127.0.0.1:$tport/token
    service: polyarch-test-registry
    issuer: polyarch-test-issuer
    rootcertbundle: $tmp/signing.crt
YAML
  docker-registry serve "$tmp/registry.yml" >"$tmp/registry.log" 2>&1 </dev/null &
  pids+=($!)
  for ((i = 0; i < 50; i++)); do
    curl -s -o /dev/null "http://127.0.0.1:$port/v2/" && break 2
    sleep 0.2
  done
done
host="127.0.0.1:$port"
curl -s -o /dev/null "http://$host/v2/" || { log "token registry did not start"; exit 1; }

# ctx DIR NAME: FROM scratch, busybox per arch (shared by both images), a file of its own
ctx() {
  mkdir -p "$1/bin/amd64" "$1/bin/arm64"
  cp "$root/fixtures/busybox/amd64/busybox" "$1/bin/amd64/"
  cp "$root/fixtures/busybox/arm64/busybox" "$1/bin/arm64/"
  printf '%s %s\n' "$2" "$RANDOM$RANDOM" >"$1/own"
  printf 'FROM scratch\nARG TARGETARCH\nCOPY bin/${TARGETARCH}/busybox /bin/busybox\nCOPY own /own\n' >"$1/Dockerfile"
}
auth="$(printf '%s:%s' "$user" "$pass" | base64 -w0)"
config() { mkdir -p "$1"; printf '{"auths":{"%s":{"auth":"%s"}}}\n' "$host" "$auth" >"$1/config.json"; }
requests() { grep -c -E '"(GET|HEAD|POST|PUT|PATCH|DELETE) /v2/' "$tmp/registry.log" || true; }
fetches() { [[ -f $tmp/tokens.jsonl ]] && wc -l <"$tmp/tokens.jsonl" || echo 0; }
uploads() { grep -E '"(PUT|PATCH) /v2/[^ ]*/blobs/uploads/' "$tmp/registry.log" | grep -c -v 'mount=' || true; }
mounts() { grep -c -E '"POST /v2/[^ ]*/blobs/uploads/\?[^ ]*mount=' "$tmp/registry.log" || true; }

# measure NAME CMD...: token fetches, requests, blob uploads and mounts of one run
declare -A F R U M
measure() {
  local name="$1" f0 r0 u0 m0
  shift
  f0=$(fetches) r0=$(requests) u0=$(uploads) m0=$(mounts)
  "$@" >"$tmp/$name.out" 2>&1 </dev/null || { log "$name failed"; tail -n 20 "$tmp/$name.out" >&2; return 1; }
  F[$name]=$(($(fetches) - f0)) R[$name]=$(($(requests) - r0))
  U[$name]=$(($(uploads) - u0)) M[$name]=$(($(mounts) - m0))
}

for c in polyarch buildx; do for i in a b; do ctx "$tmp/$c-$i" "$c-$i"; done; done
cat >"$tmp/polyarch.yaml" <<YAML
version: 1
binfmt: never
images:
$(for i in a b; do printf '  %s:\n    repository: %s\n    tags: [t]\n    context: %s\n    platforms: [linux/amd64, linux/arm64]\n    network: none\n' "$i" "$host/tok/polyarch-$i" "$tmp/polyarch-$i"; done)
YAML
config "$tmp/pa-config"
measure polyarch env DOCKER_CONFIG="$tmp/pa-config" POLYARCH_CACHE_DIR="$tmp/pa-cache" \
  "$bin" build -f "$tmp/polyarch.yaml" --record "$tmp/record.json" --quiet
measure verify env DOCKER_CONFIG="$tmp/pa-config" \
  "$bin" verify "$host/tok/polyarch-a:t" --platform linux/amd64,linux/arm64 --quiet

buildx_row=""
if [[ "${TOKENS_BUILDX:-1}" == 1 ]]; then
  H26="$(bash "$root/scripts/engine26.sh" start containerd)"
  D26BIN="$(bash "$root/scripts/engine26.sh" bin)"
  config "$tmp/bx-config"
  mkdir -p "$tmp/bx-config/cli-plugins"
  ln -s "$(bash "$root/scripts/engine26.sh" docker-config)/cli-plugins/docker-buildx" "$tmp/bx-config/cli-plugins/docker-buildx"
  {
    printf 'group "default" {\n  targets = ["a", "b"]\n}\n'
    for i in a b; do
      printf 'target "%s" {\n  context = "%s"\n  platforms = ["linux/amd64", "linux/arm64"]\n  tags = ["%s"]\n}\n' \
        "$i" "$tmp/buildx-$i" "$host/tok/buildx-$i:t"
    done
  } >"$tmp/docker-bake.hcl"
  measure buildx env DOCKER_HOST="$H26" DOCKER_CONFIG="$tmp/bx-config" \
    "$D26BIN/docker" buildx bake -f "$tmp/docker-bake.hcl" --provenance=false --push
  bx_version="$(DOCKER_HOST="$H26" DOCKER_CONFIG="$tmp/bx-config" "$D26BIN/docker" buildx version | awk '{print $2}')"
  buildx_row="| buildx $bx_version bake (Docker 26.1) | ${F[buildx]} | ${R[buildx]} | ${U[buildx]} | ${M[buildx]} |"
fi

echo "| 2 images × 2 platforms, token-auth registry | token fetches | registry requests | blob uploads (PUT/PATCH) | cross-repo mounts |"
echo "|---|---|---|---|---|"
echo "| polyarch build | ${F[polyarch]} | ${R[polyarch]} | ${U[polyarch]} | ${M[polyarch]} |"
[[ -n $buildx_row ]] && echo "$buildx_row"
echo "| polyarch verify of one 2-platform tag | ${F[verify]} | ${R[verify]} | – | – |"
