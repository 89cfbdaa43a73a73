#!/usr/bin/env bash
# `make dist`: the release archive for this machine's platform,
#   $DIST_DIR/polyarch-VERSION-TARGET.tar.gz (default DIST_DIR: dist/)
# holding the binary, its man page, shell completions, LICENSE, NOTICE and SHA256SUMS,
# and $DIST_DIR/polyarch-VERSION-TARGET.tar.gz.sha256 beside it.
# Byte for byte the same from the same commit and toolchain: SOURCE_DATE_EPOCH (default:
# the commit's time) for every mtime, entries sorted, owner 0:0, fixed modes, gzip -n;
# the binary itself is built with its paths remapped (scripts/release-env.sh).
set -euo pipefail
# shellcheck source=release-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/release-env.sh"
cd "$root"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}"
out="${DIST_DIR:-$root/dist}"

release_build
version="$("$release_bin" --version | awk '{print $2}')"
triple="$(rustc -vV | sed -n 's/^host: //p')"
name="polyarch-$version-$triple"
stage="$(mktemp -d -t polyarch-dist.XXXXXX)"
trap 'rm -rf "$stage"' EXIT
dir="$stage/$name"

install -D -m 0755 "$release_bin" "$dir/polyarch"
install -d -m 0755 "$dir/man" "$dir/completions"
"$release_bin" man >"$dir/man/polyarch.1"
"$release_bin" completions bash >"$dir/completions/polyarch.bash"
"$release_bin" completions zsh >"$dir/completions/_polyarch"
"$release_bin" completions fish >"$dir/completions/polyarch.fish"
cp LICENSE NOTICE "$dir/"
(cd "$dir" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort |
  xargs sha256sum >SHA256SUMS)
chmod -R u=rwX,go=rX "$dir"

mkdir -p "$out"
archive="$out/$name.tar.gz"
LC_ALL=C tar --sort=name --format=gnu --mtime="@$epoch" --owner=0 --group=0 \
  --numeric-owner -C "$stage" -cf - "$name" | gzip -n -9 >"$archive"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "$archive"
