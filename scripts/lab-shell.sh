#!/usr/bin/env bash
# Boot the lab guest and give you its serial console (root logged in).
# Quit with `poweroff` in the guest or Ctrl-A X; QEMU is killed on exit.
# Needs scripts/lab-deps.sh && scripts/lab-image.sh first. Options: --no-iommu
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# QEMU puts the terminal in raw mode; give it back even if QEMU is killed.
if [[ -t 0 ]]; then
    trap 'stty sane 2>/dev/null || true' EXIT
fi
python3 "$here/../tests/lab/shell.py" "$@"
