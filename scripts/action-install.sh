#!/usr/bin/env bash
# action.yml, step `install`: polyarch's release binary, built from the action's own
# checkout (a cache hit leaves nothing to build), as output `bin`.
set -euo pipefail
# shellcheck source=release-env.sh
source "$GITHUB_ACTION_PATH/scripts/release-env.sh"
release_build
"$release_bin" --version
echo "bin=$release_bin" >>"$GITHUB_OUTPUT"
