#!/usr/bin/env bash
# `make install`: the release binary, its man page (`polyarch man`) and shell completions
# (`polyarch completions SHELL`) under $DESTDIR$PREFIX, laid out as Debian and Homebrew
# expect them. With DOCKER_PLUGIN=user or system it also installs the binary as the
# Docker CLI plugin `docker-polyarch` (`docker polyarch …`):
#   user:   ${DOCKER_CONFIG:-~/.docker}/cli-plugins
#   system: $DESTDIR$PREFIX/lib/docker/cli-plugins (/usr/local/lib/docker/cli-plugins is
#           one of the directories the Docker CLI searches; so is /usr/lib/… for PREFIX=/usr)
set -euo pipefail
# shellcheck source=release-env.sh
source "$(dirname "${BASH_SOURCE[0]}")/release-env.sh"
prefix="${PREFIX:-/usr/local}"
dest="${DESTDIR:-}$prefix"

release_build
bin="$release_bin"
install -D -m 0755 "$bin" "$dest/bin/polyarch"
install -d -m 0755 "$dest/share/man/man1" "$dest/share/bash-completion/completions" \
  "$dest/share/zsh/site-functions" "$dest/share/fish/vendor_completions.d"
"$bin" man >"$dest/share/man/man1/polyarch.1"
"$bin" completions bash >"$dest/share/bash-completion/completions/polyarch"
"$bin" completions zsh >"$dest/share/zsh/site-functions/_polyarch"
"$bin" completions fish >"$dest/share/fish/vendor_completions.d/polyarch.fish"
chmod 0644 "$dest/share/man/man1/polyarch.1" "$dest/share/bash-completion/completions/polyarch" \
  "$dest/share/zsh/site-functions/_polyarch" "$dest/share/fish/vendor_completions.d/polyarch.fish"
echo "installed polyarch in $dest (bin, share/man, completions)"

case "${DOCKER_PLUGIN:-}" in
  "") ;;
  user) plugins="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins" ;;
  system) plugins="$dest/lib/docker/cli-plugins" ;;
  *) echo "install: DOCKER_PLUGIN=${DOCKER_PLUGIN}: expected user or system" >&2; exit 2 ;;
esac
if [[ -n "${DOCKER_PLUGIN:-}" ]]; then
  install -D -m 0755 "$bin" "$plugins/docker-polyarch"
  echo "installed the Docker CLI plugin as $plugins/docker-polyarch (docker polyarch …)"
fi
