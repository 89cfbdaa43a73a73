# Sourced by scripts/install.sh, scripts/dist.sh and the install test: one release build
# for all of them, and a binary that does not depend on where it was built. rustc names
# this package's files relative to the checkout, but the dependencies' (panic locations)
# by their path under the cargo home: mapped to a fixed name, the same commit and
# toolchain give the same bytes on any machine. (The flags stay the same for every
# checkout, so builds from clones still share the dependencies' build.)
# Sets: root, cargo_target, release_bin, and exports RUSTFLAGS.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
export RUSTFLAGS="--remap-path-prefix=$cargo_home=/cargo"
cargo_target="${CARGO_TARGET_DIR:-$root/target}"
release_bin="$cargo_target/release/polyarch"

# release_build: the release binary, built from Cargo.lock as committed.
release_build() {
  (cd "$root" && "${CARGO:-cargo}" build --release --locked --bin polyarch)
}
