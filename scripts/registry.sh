# Sourced by scripts/demo.sh and bench/run.sh: a throw-away CNCF distribution registry
# (Debian's docker-registry) on a free 127.0.0.1 port, data under $tmp.
# Sets reg_pid and registry_port; the caller's EXIT trap stops it (stop_registry).

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# try_registry PORT LOGLEVEL -> 0 when /v2/ answers
try_registry() {
  local port="$1" level="$2" i
  cat >"$tmp/registry.yml" <<YAML
version: 0.1
log:
  level: $level
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $tmp/registry-data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
YAML
  docker-registry serve "$tmp/registry.yml" >"$tmp/registry.log" 2>&1 </dev/null &
  reg_pid=$!
  for ((i = 0; i < 50; i++)); do
    if curl -fsS -o /dev/null "http://127.0.0.1:$port/v2/" 2>/dev/null; then return 0; fi
    kill -0 "$reg_pid" 2>/dev/null || break
    sleep 0.2
  done
  kill "$reg_pid" 2>/dev/null || true
  wait "$reg_pid" 2>/dev/null || true
  reg_pid=""
  tail -n 5 "$tmp/registry.log" >&2
  return 1
}

# start_registry [LOGLEVEL] -> 0 with registry_port set, after a few random free ports
start_registry() {
  local level="${1:-info}" p
  registry_port=""
  for _ in 1 2 3 4 5 6 7 8; do
    p=$((20000 + RANDOM % 40000))
    port_in_use "$p" && continue
    if try_registry "$p" "$level"; then registry_port="$p"; return 0; fi
  done
  return 1
}

# stop_registry -> 0 when a registry was running and is now stopped
stop_registry() {
  if [[ -n "${reg_pid:-}" ]] && kill -0 "$reg_pid" 2>/dev/null; then
    kill "$reg_pid" 2>/dev/null || true
    wait "$reg_pid" 2>/dev/null || true
    return 0
  fi
  return 1
}
