#!/usr/bin/env bash
# cosign from Debian sid, for the cross-check of tests/sign.rs: the package is
# downloaded with a private apt state (the host's apt lists and dpkg database are
# never touched) and unpacked into a cache; cosign is a static Go binary.
#
# Usage: cosign.sh   prints the path of the cosign binary (fetched when missing)
#
# Knobs: POLYARCH_COSIGN_CACHE=DIR (default /var/cache/polyarch/cosign),
#        POLYARCH_COSIGN_MIRROR=URL (default: the host's bookworm archive),
#        POLYARCH_SKIP_INSTALL=1 (fail instead of downloading).
set -euo pipefail

cache="${POLYARCH_COSIGN_CACHE:-/var/cache/polyarch/cosign}"
cache="${cache%/}"
bin="$cache/root/usr/bin/cosign"
log() { printf 'cosign.sh: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ -x "$bin" ]]; then
  printf '%s\n' "$bin"
  exit 0
fi
[[ "${POLYARCH_SKIP_INSTALL:-}" != 1 ]] || die "no cosign in $cache and POLYARCH_SKIP_INSTALL=1"

# shellcheck source=debian-mirror.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"
mirror="$(debian_mirror "${POLYARCH_COSIGN_MIRROR:-}")"
arch="$(dpkg --print-architecture)"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
signed=""
[[ -f "$keyring" ]] && signed=" signed-by=$keyring"
mkdir -p "$cache/apt/lists/partial" "$cache/apt/cache/archives/partial" "$cache/debs"
printf 'deb [arch=%s%s] %s sid main\n' "$arch" "$signed" "$mirror" >"$cache/apt/sources.list"
: >"$cache/apt/status"
if id _apt >/dev/null 2>&1; then chown -R _apt "$cache/apt" "$cache/debs"; fi
opts=(
  -o "Dir::Etc::SourceList=$cache/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o "Dir::State::Lists=$cache/apt/lists" -o "Dir::Cache=$cache/apt/cache"
  -o "Dir::State::status=$cache/apt/status"
  -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
  -o Acquire::Languages=none -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
)
log "fetching cosign from Debian sid ($mirror) into a private apt state in $cache"
apt-get "${opts[@]}" update -qq </dev/null >&2 || die "apt-get update of the private sid list failed"
(cd "$cache/debs" && apt-get "${opts[@]}" download -qq cosign/sid </dev/null >&2) ||
  die "apt-get download cosign/sid failed"
rm -rf "$cache/root.new"
mkdir -p "$cache/root.new"
dpkg-deb -x "$(ls -t "$cache"/debs/cosign_*.deb | head -n 1)" "$cache/root.new"
rm -rf "$cache/root"
mv "$cache/root.new" "$cache/root"
[[ -x "$bin" ]] || die "the cosign package has no usr/bin/cosign"
log "$("$bin" version 2>/dev/null | grep -i gitversion || true)"
printf '%s\n' "$bin"
