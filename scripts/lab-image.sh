#!/usr/bin/env bash
# Build (or reuse from the cache) the QEMU guest image for tests/lab.
# Prints progress on stderr and the image directory on stdout.
# Cache: ${RDMAD_LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdmad-lab}, keyed by
# a hash of every input (see tests/lab/README.md). Run as root.
set -euo pipefail
exec "$(dirname "${BASH_SOURCE[0]}")/../tests/lab/image/build.sh" "$@"
