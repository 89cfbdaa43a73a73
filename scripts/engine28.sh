#!/usr/bin/env bash
# Docker 28.5 (API 1.51, containerd 2.1, buildx 0.29.1, Debian sid) beside the
# machine's engine and Docker 26.1: scripts/engine26.sh with
# POLYARCH_DOCKER_SERIES=28 (same commands; see its header).
POLYARCH_DOCKER_SERIES=28 exec bash "$(dirname "${BASH_SOURCE[0]}")/engine26.sh" "$@"
