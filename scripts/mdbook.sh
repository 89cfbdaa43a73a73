#!/usr/bin/env bash
# mdBook for the book under docs/ (`make docs`), pinned and built from crates.io:
# Debian bookworm has no mdbook package, and sid's needs glibc 2.39. Built once with
# `cargo install --locked` into a cache directory outside the clone (7 minutes on a busy
# 2-core machine), then reused: `make docs` itself takes under a second.
#
# Usage: mdbook.sh install          install the pinned mdbook when it is missing (idempotent)
#        mdbook.sh path             print the mdbook binary's path
#        mdbook.sh ARGS...          install if needed, then run `mdbook ARGS...`
#
# Knobs (environment):
#   POLYARCH_MDBOOK_ROOT=DIR   where it is installed (default /var/cache/polyarch/mdbook-VERSION
#                              as root, else ~/.cache/polyarch/mdbook-VERSION)
#   POLYARCH_SKIP_INSTALL=1    fail instead of building it
set -euo pipefail

version=0.5.4
if [[ $(id -u) -eq 0 ]]; then
  default_root="/var/cache/polyarch/mdbook-$version"
else
  default_root="${XDG_CACHE_HOME:-$HOME/.cache}/polyarch/mdbook-$version"
fi
root="${POLYARCH_MDBOOK_ROOT:-$default_root}"
bin="$root/bin/mdbook"

log() { printf 'mdbook.sh: %s\n' "$*" >&2; }

install() {
  if [[ -x "$bin" ]] && [[ "$("$bin" --version)" == "mdbook v$version" ]]; then return 0; fi
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && { log "mdbook $version missing at $bin (POLYARCH_SKIP_INSTALL=1)"; exit 1; }
  command -v cargo >/dev/null || { log "cargo not found on PATH"; exit 1; }
  log "building mdbook $version from crates.io into $root (once; a few minutes)"
  mkdir -p "$root"
  # Without `serve` and `watch` (an HTTP server and file watching): `mdbook build` needs
  # neither, and they are a third of the build.
  cargo install --locked --quiet --root "$root" --version "$version" \
    --no-default-features --features search mdbook
  "$bin" --version >/dev/null || { log "the built mdbook does not run"; exit 1; }
}

case "${1:-}" in
  install) install ;;
  path) printf '%s\n' "$bin" ;;
  "") log "usage: mdbook.sh install | path | ARGS..."; exit 2 ;;
  *) install; exec "$bin" "$@" ;;
esac
