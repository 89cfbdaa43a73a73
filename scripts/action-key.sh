#!/usr/bin/env bash
# action.yml, step `key`: the cache key of the action's cargo build: the runner's
# platform and a hash of what the build reads (the action's checkout is not a git
# repository on the runner, and hashFiles() sees only the workspace).
set -euo pipefail
cd "$GITHUB_ACTION_PATH"
sources="$(find Cargo.toml Cargo.lock src schema -type f -print0 | LC_ALL=C sort -z |
  xargs -0 sha256sum | sha256sum | cut -c1-16)"
prefix="polyarch-${RUNNER_OS:-Linux}-${RUNNER_ARCH:-X64}-$(rustc -V 2>/dev/null | awk '{print $2}')-"
{
  echo "key=$prefix$sources"
  echo "restore=$prefix"
} >>"$GITHUB_OUTPUT"
