#!/usr/bin/env bash
# buildkitd and buildctl built from Debian's package archive alone, for the test
# suite's standalone BuildKit daemon (scripts/buildkitd.sh). Debian has no
# buildkitd package, but sid's golang-github-docker-docker-dev (built from the
# docker.io source) ships BuildKit's whole source under /usr/share/gocode. It is
# built the way dh-golang builds Debian's Go packages: sid's Go and sid's
# golang-*-dev libraries unpacked into a private GOPATH (never installed), with
# GO111MODULE=off and GOPROXY=off. apt is the only thing that downloads, from the
# Debian archive the host already uses, with a private apt state: the host's apt
# lists, configuration and dpkg database are never touched.
#
# Usage: buildkit-debian.sh COMMAND
#   build   make the binaries when the cache has none (seconds when it has);
#           prints the directory holding buildkitd and buildctl
#   dir     print that directory (whether or not the binaries are there yet)
#
# What does not come as a package, and what is done about it:
#   - two libraries BuildKit imports exist in Debian only inside docker.io's own
#     source (engine/vendor of the orig tarball): unpacked from that tarball,
#     fetched with `apt-get source --print-uris` and apt's own downloader;
#   - the fuse-overlayfs snapshotter has no Debian package and sid's stargz
#     snapshotter predates containerd v2: buildkitd's OCI worker is built
#     without both (its `auto` snapshotter falls back to overlayfs or native);
#   - GOPATH mode resolves .../v2 imports only below a go.mod: a 3-line one is
#     written at the source's root.
#
# Cache (POLYARCH_BUILDKIT_CACHE, default /var/cache/polyarch/buildkit):
#   apt/ debs/ src/   private apt state, downloaded .debs and the docker.io tarball
#   go/ gopath/       the unpacked toolchain and GOPATH tree (about 2 GB in all)
#   gocache/          Go's build cache
#   bin/              buildkitd, buildctl and STAMP (what they were built from)
#
# Knobs (environment):
#   POLYARCH_BUILDKIT_CACHE=DIR   the cache above
#   POLYARCH_BUILDKIT_MIRROR=URL  Debian archive (default: the host's bookworm one)
#   POLYARCH_SKIP_INSTALL=1       fail instead of downloading when bin/ is empty
set -euo pipefail

cache="${POLYARCH_BUILDKIT_CACHE:-/var/cache/polyarch/buildkit}"
cache="${cache%/}"
bin="$cache/bin"
suite=sid
# Bump when the way the binaries are made changes: forces a rebuild.
layout=1

log() { printf 'buildkit-debian: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
# Pipes here read to the end, never `exit` or `head` early: under pipefail the
# writer's SIGPIPE would end the script without a word.

built() { [[ -x "$bin/buildkitd" && -x "$bin/buildctl" && "$(head -n 1 "$bin/STAMP" 2>/dev/null)" == "layout=$layout" ]]; }

# ------------------------------------------------------------------ private apt for sid

# shellcheck source=debian-mirror.sh
source "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"

apt_setup() {
  local arch keyring signed="" mirror
  mirror="$(debian_mirror "${POLYARCH_BUILDKIT_MIRROR:-}")"
  arch="$(dpkg --print-architecture)"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [[ -f "$keyring" ]] && signed=" signed-by=$keyring"
  mkdir -p "$cache/apt/lists/partial" "$cache/apt/cache/archives/partial" "$cache/debs" "$cache/src"
  printf 'deb [arch=%s%s] %s %s main\ndeb-src [%s] %s %s main\n' \
    "$arch" "$signed" "$mirror" "$suite" "${signed# }" "$mirror" "$suite" >"$cache/apt/sources.list"
  : >"$cache/apt/status" # an empty dpkg database: the host's packages play no part
  # apt downloads as the user _apt: let it write there.
  if id _apt >/dev/null 2>&1; then chown -R _apt "$cache/apt" "$cache/debs" "$cache/src"; fi
  apt_opts=(
    -o "Dir::Etc::SourceList=$cache/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$cache/apt/lists" -o "Dir::Cache=$cache/apt/cache"
    -o "Dir::State::status=$cache/apt/status"
    -o "APT::Architecture=$arch" -o "APT::Architectures=$arch"
    -o Acquire::Languages=none -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
  )
  log "apt-get update (Debian $suite from $mirror, private state in $cache/apt)"
  apt-get "${apt_opts[@]}" update -qq </dev/null >&2 || die "apt-get update of the private $suite lists failed"
}

# field PKG NAME : a field of PKG's candidate in sid
field() {
  apt-cache "${apt_opts[@]}" show "$1" 2>/dev/null |
    awk -v f="$2:" '$1 == f && !done { sub(/^[^:]*: */, ""); print; done = 1 }'
}

# fetch PKG... : download the sid candidates of PKG... into debs/ (kept between runs)
fetch() {
  local want=() p
  for p in "$@"; do
    compgen -G "$cache/debs/${p}_*.deb" >/dev/null || want+=("$p/$suite")
  done
  [[ ${#want[@]} -eq 0 ]] && return 0
  log "apt-get download ${#want[@]} package(s)"
  (cd "$cache/debs" && apt-get "${apt_opts[@]}" download -qq "${want[@]}" </dev/null >&2) ||
    die "apt-get download failed: ${want[*]}"
}

# unpack DEST PKG... : dpkg-deb -x each downloaded PKG into DEST
unpack() {
  local dest="$1" p deb
  shift
  for p in "$@"; do
    deb="$(compgen -G "$cache/debs/${p}_*.deb" | sort -V | tail -n 1)"
    [[ -n "$deb" ]] || die "not downloaded: $p"
    dpkg-deb -x "$deb" "$dest"
  done
}

# ------------------------------------------------------------------ build

# Go-Import-Path -> golang-*-dev binary package, from sid's Sources index
import_map() {
  local sources
  sources="$(compgen -G "$cache/apt/lists/*_${suite}_main_source_Sources*" | sed -n 1p)"
  [[ -n "$sources" ]] || die "no $suite Sources index in $cache/apt/lists (deb-src)"
  /usr/lib/apt/apt-helper cat-file "$sources" | python3 -c '
import re, sys
def emit(stanza):
    paths = re.split(r"[,\s]+", stanza.get("go-import-path", ""))
    devs = [b.strip() for b in stanza.get("binary", "").split(",") if b.strip().endswith("-dev")]
    for path in filter(None, paths):
        for dev in devs:
            print(path, dev)
stanza, key = {}, None
for line in sys.stdin:
    line = line.rstrip("\n")
    if not line:
        emit(stanza); stanza, key = {}, None
    elif line[0] in " \t":
        if key: stanza[key] += " " + line.strip()
    else:
        key, _, value = line.partition(":"); key = key.lower(); stanza[key] = value.strip()
emit(stanza)' | sort -u >"$cache/import-map.txt"
}

# stdin: import paths go cannot find; prints the -dev packages not yet unpacked that
# provide them (longest matching Go-Import-Path), and "- PATH" for those none provides
packages_for() {
  python3 -c '
import sys
have = set(open(sys.argv[2]).read().split())
provider = {}
for line in open(sys.argv[1]):
    path, dev = line.split()
    provider.setdefault(path, set()).add(dev)
for missing in sys.stdin.read().split():
    prefix = missing
    while prefix and prefix not in provider:
        prefix = prefix.rpartition("/")[0]
    new = provider.get(prefix, set()) - have
    print(" ".join(sorted(new)) if new else "- " + missing)' "$cache/import-map.txt" "$cache/unpacked.txt"
}

missing_imports() {
  (cd "$src" && go list -e -deps -f '{{if .Error}}{{.ImportPath}}{{end}}' ./cmd/buildkitd ./cmd/buildctl 2>/dev/null | sort -u)
}

# vendor_from_engine PATH : copy PATH from engine/vendor of docker.io's orig tarball
vendor_from_engine() {
  local tarball="$1" path="$2" t
  tar -tJf "$tarball" --wildcards "*/engine/vendor/$path/*.go" >/dev/null 2>&1 || return 1
  t="$(mktemp -d "$cache/vendor.XXXXXX")"
  tar -xJf "$tarball" -C "$t" --wildcards "*/engine/vendor/$path/*"
  mkdir -p "$src/vendor/$path"
  cp -a "$(find "$t" -type d -path "*/engine/vendor/$path" | sed -n 1p)/." "$src/vendor/$path/"
  rm -rf "$t"
  log "  $path: from docker.io's engine/vendor"
}

# The OCI worker without the snapshotters whose Go libraries Debian lacks; the
# imports only their code used are dropped by go_build as the compiler names them.
patch_worker() {
  python3 - "$src/cmd/buildkitd/main_oci_worker.go" <<'EOF'
import re, sys
path = sys.argv[1]
text = open(path).read()
text = re.sub(r'\n\t\w+ "github\.com/containerd/(fuse-overlayfs-snapshotter|stargz-snapshotter)/[^"]*"', '', text)
# `auto` tries fuse-overlayfs when overlayfs cannot work: fall back to native at once.
auto = re.search(r'\t\t\} else \{\n\t\t\tbklog\.L\.Debugf\("auto snapshotter: overlayfs is not available.*?\n\t\t\}\n', text, re.S)
text = text[:auto.start()] + (
    '\t\t} else {\n'
    '\t\t\tbklog.L.Debugf("auto snapshotter: overlayfs is not available for %s, using native: %v", commonRoot, err)\n'
    '\t\t\tname = "native"\n'
    '\t\t}\n') + text[auto.end():]
start = text.index('\tcase "fuse-overlayfs":\n')
end = text.index('\tdefault:\n', start)
text = text[:start] + (
    '\tcase "fuse-overlayfs", "stargz":\n'
    '\t\treturn snFactory, errors.Errorf("snapshotter %q is not in this build: Debian has no Go library for it", name)\n'
) + text[end:]
# The stargz snapshotter's labels and session source, to the end of the file.
text = text[:text.index('\nconst (\n\t// targetRefLabel') + 1]
open(path, 'w').write(text)
EOF
}

# go build, dropping imports of the patched file that the Go compiler reports unused
go_build() {
  local cmd="$1" out unused i
  for _ in 1 2 3 4 5 6; do
    if out="$(cd "$src" && nice -n 10 go build -trimpath -tags 'osusergo netgo' -ldflags "$ldflags" \
      -o "$bin.new/$cmd" "./cmd/$cmd" 2>&1)"; then
      return 0
    fi
    unused="$(grep -oE 'main_oci_worker\.go:[0-9:]+ "[^"]+" imported (as [A-Za-z0-9_]+ )?and not used' <<<"$out" | cut -d'"' -f2)"
    [[ -n "$unused" ]] || { printf '%s\n' "$out" >&2; die "go build ./cmd/$cmd failed"; }
    for i in $unused; do
      python3 -c 'import re, sys; p = sys.argv[1]; s = open(p).read(); open(p, "w").write(re.sub(r"\n\t(?:\w+ )?\"" + re.escape(sys.argv[2]) + r"\"\n", "\n", s, count=1))' \
        "$src/cmd/buildkitd/main_oci_worker.go" "$i"
    done
  done
  printf '%s\n' "$out" >&2
  die "go build ./cmd/$cmd failed"
}

do_build() {
  built && { printf '%s\n' "$bin"; return 0; }
  [[ $(id -u) -eq 0 ]] || die "building BuildKit needs root (apt's private state as _apt)"
  [[ "${POLYARCH_SKIP_INSTALL:-}" == 1 ]] && die "no buildkitd in $bin (POLYARCH_SKIP_INSTALL=1; run scripts/buildkit-debian.sh build)"
  local tool
  for tool in apt-get apt-cache dpkg-deb python3 tar xz; do
    command -v "$tool" >/dev/null 2>&1 || die "missing tool: $tool (apt-get install apt dpkg python3 tar xz-utils)"
  done
  mkdir -p "$cache"
  exec 9>"$cache.lock"
  flock -w 1200 9 || die "timed out waiting for $cache.lock"
  built && { printf '%s\n' "$bin"; return 0; } # another process finished it
  local t0=$SECONDS
  apt_setup

  local dev_version upstream go_pkg go_version
  dev_version="$(field golang-github-docker-docker-dev Version)"
  [[ -n "$dev_version" ]] || die "golang-github-docker-docker-dev is not in Debian $suite"
  upstream="${dev_version#*:}" upstream="${upstream%-*}"
  go_pkg="$(field golang-go Depends | grep -oE 'golang-1\.[0-9]+-go' | sed -n 1p)"
  [[ -n "$go_pkg" ]] || die "cannot tell $suite's default Go from golang-go's Depends"
  go_version="${go_pkg#golang-}" go_version="${go_version%-go}"
  log "BuildKit from golang-github-docker-docker-dev $dev_version, Go $go_version"

  # Go, and the BuildKit source
  fetch "$go_pkg" "golang-$go_version-src" golang-github-docker-docker-dev
  rm -rf "$cache/go" "$cache/gopath" "$bin.new"
  mkdir -p "$cache/go" "$cache/gopath" "$bin.new"
  unpack "$cache/go" "$go_pkg" "golang-$go_version-src"
  unpack "$cache/gopath" golang-github-docker-docker-dev
  printf '%s\n' golang-github-docker-docker-dev >"$cache/unpacked.txt"
  export GOROOT="$cache/go/usr/lib/go-$go_version"
  export PATH="$GOROOT/bin:$PATH"
  export GOPATH="$cache/gopath/usr/share/gocode" GOCACHE="$cache/gocache"
  export GO111MODULE=off GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local GOFLAGS= GOWORK=off CGO_ENABLED=0
  go version >&2 || die "the unpacked Go $go_version does not run"
  src="$GOPATH/src/github.com/moby/buildkit"
  [[ -d "$src/cmd/buildkitd" && -d "$src/cmd/buildctl" ]] || die "no cmd/buildkitd or cmd/buildctl in golang-github-docker-docker-dev $dev_version"
  [[ -f "$src/go.mod" ]] || printf 'module github.com/moby/buildkit\n\ngo 1.24\n' >"$src/go.mod"
  patch_worker

  # docker.io's orig tarball, for the two libraries only its engine/vendor has
  local tarball="$cache/src/docker.io_${upstream}.orig.tar.xz" uri url hash
  if [[ ! -s "$tarball" ]]; then
    # --print-uris lists only what the current directory lacks: ask from an empty one.
    uri="$(cd "$(mktemp -d "$cache/uris.XXXXXX")" && apt-get "${apt_opts[@]}" source --print-uris -qq "docker.io=$dev_version" 2>/dev/null |
      awk -v f="$(basename "$tarball")" '$2 == f && !done { print; done = 1 }')"
    rm -rf "$cache"/uris.*
    [[ -n "$uri" ]] || die "docker.io $dev_version has no $(basename "$tarball") in $suite's sources"
    read -r url _ _ hash <<<"$uri"
    log "downloading $(basename "$tarball")"
    /usr/lib/apt/apt-helper download-file "${url//\'/}" "$tarball.part" "$hash" >&2 ||
      die "apt-helper could not download ${url//\'/}"
    mv "$tarball.part" "$tarball"
  fi

  # The libraries: repeat `go list -deps` and unpack the -dev packages whose
  # Go-Import-Path covers what is missing, until nothing is.
  import_map
  local pass missing lines new unresolved path
  for pass in $(seq 1 30); do
    missing="$(missing_imports)"
    [[ -z "$missing" ]] && break
    lines="$(packages_for <<<"$missing")"
    new="$(grep -v '^- ' <<<"$lines" | tr ' ' '\n' | sort -u | sed '/^$/d' || true)"
    unresolved="$(grep '^- ' <<<"$lines" | cut -c3- || true)"
    log "pass $pass: $(wc -l <<<"$missing") missing imports, $(wc -w <<<"$new") new package(s)"
    local progress=0
    if [[ -n "$new" ]]; then
      # shellcheck disable=SC2086
      fetch $new
      # shellcheck disable=SC2086
      unpack "$cache/gopath" $new
      printf '%s\n' $new >>"$cache/unpacked.txt"
      progress=1
    fi
    for path in $unresolved; do
      [[ -d "$src/vendor/$path" ]] && continue
      vendor_from_engine "$tarball" "$path" && progress=1
    done
    [[ $progress -eq 1 ]] || die "no Debian package provides: $(tr '\n' ' ' <<<"$missing")"
  done
  [[ -z "$(missing_imports)" ]] || die "imports still missing after 30 passes"

  local bk_version
  bk_version="$(tar -xJOf "$tarball" --wildcards '*/engine/vendor.mod' | awk '$1 == "github.com/moby/buildkit" && !done { print $2; done = 1 }')"
  ldflags="-s -w -X github.com/moby/buildkit/version.Version=${bk_version:-unknown} -X github.com/moby/buildkit/version.Revision=debian-$dev_version -X github.com/moby/buildkit/version.Package=github.com/moby/buildkit"
  for tool in buildctl buildkitd; do
    log "go build ./cmd/$tool (BuildKit ${bk_version:-unknown}, GOPATH mode)"
    go_build "$tool"
  done
  {
    printf 'layout=%s\n' "$layout"
    printf 'golang-github-docker-docker-dev=%s go=%s buildkit=%s\n' "$dev_version" "$go_version" "$bk_version"
    sort -u "$cache/unpacked.txt" | tr '\n' ' '
    printf '\n'
  } >"$bin.new/STAMP"
  "$bin.new/buildkitd" --version >&2 || die "the built buildkitd does not run"
  rm -rf "$bin"
  mv "$bin.new" "$bin"
  log "built in $((SECONDS - t0))s: $(sort -u "$cache/unpacked.txt" | wc -l) Debian packages; $bin"
  printf '%s\n' "$bin"
}

case "${1:-}" in
  build) do_build ;;
  dir) printf '%s\n' "$bin" ;;
  *)
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}" >&2
    exit 2
    ;;
esac
