#!/usr/bin/env bash
# The tree's files as git would commit them (tracked and untracked, not ignored, and
# present: a deleted tracked file is left out), sorted, NUL-separated on stdout. What the
# package builds hash and copy, and what scripts/test-pythons.sh copies into its root.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -z --cached --others --exclude-standard | sort -z |
    while IFS= read -r -d '' f; do [[ -f $f ]] && printf '%s\0' "$f"; done
