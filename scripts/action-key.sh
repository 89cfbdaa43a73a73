#!/usr/bin/env bash
# action.yml, step `key`: the cache key of the action's cargo build: the runner's
# platform and a hash of what the build reads (the action's checkout is not a git
# repository on the runner, and hashFiles() sees only the workspace). And where polyarch
# keeps its memory, with a key of its own per run: a cache entry is never overwritten, so
# each run saves a new one and the next run restores the newest (restore-keys prefix).
set -euo pipefail
cd "$GITHUB_ACTION_PATH"
sources="$(find Cargo.toml Cargo.lock src schema -type f -print0 | LC_ALL=C sort -z |
  xargs -0 sha256sum | sha256sum | cut -c1-16)"
prefix="polyarch-${RUNNER_OS:-Linux}-${RUNNER_ARCH:-X64}-$(rustc -V 2>/dev/null | awk '{print $2}')-"
state_dir="${POLYARCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/polyarch}"
state_prefix="polyarch-state-${RUNNER_OS:-Linux}-${RUNNER_ARCH:-X64}-"
{
  echo "key=$prefix$sources"
  echo "restore=$prefix"
  echo "state-dir=$state_dir"
  echo "state-key=$state_prefix${GITHUB_RUN_ID:-$(date +%s)}-${GITHUB_RUN_ATTEMPT:-1}-${GITHUB_JOB:-job}-$RANDOM"
  echo "state-restore=$state_prefix"
} >>"$GITHUB_OUTPUT"
