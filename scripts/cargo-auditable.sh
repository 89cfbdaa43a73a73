#!/usr/bin/env bash
# cargo-auditable, for tests/sbom.rs's cross-check of the SBOM's Rust crates against a real
# `cargo auditable build`: Debian has no package of it, so it is pinned and built from
# crates.io once with `cargo install --locked` into a cache directory outside the clone
# (40 s of CPU; five minutes on a loaded 2-core machine), then reused.
#
# Usage: cargo-auditable.sh install   install the pinned cargo-auditable when it is missing (idempotent)
#        cargo-auditable.sh path      install it if needed, then print the directory holding the
#                                     `cargo-auditable` binary (put it on PATH for
#                                     `cargo auditable build`)
#
# Knobs (environment):
#   POLYARCH_CARGO_AUDITABLE_ROOT=DIR  where it is installed (default
#                                      /var/cache/polyarch/cargo-auditable-VERSION as root, else
#                                      ~/.cache/polyarch/cargo-auditable-VERSION)
#   POLYARCH_SKIP_INSTALL=1            fail instead of building it
set -euo pipefail

version=0.7.7
if [[ $(id -u) -eq 0 ]]; then
  default_root="/var/cache/polyarch/cargo-auditable-$version"
else
  default_root="${XDG_CACHE_HOME:-$HOME/.cache}/polyarch/cargo-auditable-$version"
fi
root="${POLYARCH_CARGO_AUDITABLE_ROOT:-$default_root}"
bin="$root/bin/cargo-auditable"

log() { printf 'cargo-auditable.sh: %s\n' "$*" >&2; }

install() {
  if [[ -x "$bin" ]]; then return 0; fi
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && { log "cargo-auditable $version missing at $bin (POLYARCH_SKIP_INSTALL=1)"; exit 1; }
  command -v cargo >/dev/null || { log "cargo not found on PATH"; exit 1; }
  log "building cargo-auditable $version from crates.io into $root (once; a few minutes)"
  mkdir -p "$root"
  cargo install --locked --quiet --root "$root" --version "$version" cargo-auditable
  [[ -x "$bin" ]] || { log "cargo install left no $bin"; exit 1; }
}

case "${1:-}" in
  install) install ;;
  path) install; printf '%s\n' "$root/bin" ;;
  *) log "usage: cargo-auditable.sh install | path"; exit 2 ;;
esac
