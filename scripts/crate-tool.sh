#!/usr/bin/env bash
# The tools polyarch's development takes from crates.io, pinned, as Debian has no package
# of them (bookworm has no mdbook, and sid's needs glibc 2.39):
#   mdbook           builds the book under docs/ (`make docs`)
#   cargo-auditable  tests/sbom.rs's cross-check of the SBOM's Rust crates against a real
#                    `cargo auditable build`
# Each is built once with `cargo install --locked` into a cache directory outside the clone
# (minutes on a loaded 2-core machine), then reused.
#
# Usage: crate-tool.sh TOOL install        install the pinned TOOL when it is missing (idempotent)
#        crate-tool.sh TOOL path           install it if needed, then print its binary's path
#        crate-tool.sh TOOL run ARGS...    install it if needed, then run it with ARGS
#
# Knobs (environment):
#   POLYARCH_MDBOOK_ROOT=DIR, POLYARCH_CARGO_AUDITABLE_ROOT=DIR
#                              where the tool is installed (default
#                              /var/cache/polyarch/TOOL-VERSION as root, else
#                              ~/.cache/polyarch/TOOL-VERSION)
#   POLYARCH_SKIP_INSTALL=1    fail instead of building it
set -euo pipefail

log() { printf 'crate-tool.sh: %s\n' "$*" >&2; }
usage() { log "usage: crate-tool.sh mdbook|cargo-auditable install | path | run ARGS..."; exit 2; }

tool="${1:-}"
case "$tool" in
  # Without mdbook's `serve` and `watch` (an HTTP server and file watching): `mdbook build`
  # needs neither, and they are a third of the build.
  mdbook) version=0.5.4; features=(--no-default-features --features search) ;;
  cargo-auditable) version=0.7.7; features=() ;;
  *) usage ;;
esac
if [[ $(id -u) -eq 0 ]]; then
  default_root="/var/cache/polyarch/$tool-$version"
else
  default_root="${XDG_CACHE_HOME:-$HOME/.cache}/polyarch/$tool-$version"
fi
knob="POLYARCH_$(tr 'a-z-' 'A-Z_' <<<"$tool")_ROOT"
root="${!knob:-$default_root}"
bin="$root/bin/$tool"

install() {
  # cargo install records what it installed: a root given by the knob may hold another version.
  if [[ -x "$bin" ]] && grep -qF "\"$tool $version " "$root/.crates.toml" 2>/dev/null; then return 0; fi
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && { log "$tool $version missing at $bin (POLYARCH_SKIP_INSTALL=1)"; exit 1; }
  command -v cargo >/dev/null || { log "cargo not found on PATH"; exit 1; }
  log "building $tool $version from crates.io into $root (once; a few minutes)"
  mkdir -p "$root"
  cargo install --locked --quiet --root "$root" --version "$version" "${features[@]}" "$tool"
  [[ -x "$bin" ]] || { log "cargo install left no $bin"; exit 1; }
}

case "${2:-}" in
  install) install ;;
  path) install; printf '%s\n' "$bin" ;;
  run) install; shift 2; exec "$bin" "$@" ;;
  *) usage ;;
esac
