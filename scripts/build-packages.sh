#!/usr/bin/env bash
# Build every package of packaging/targets.toml for amd64 and arm64 (7 releases x 2
# architectures), each cached like build-deb.sh / build-rpm.sh, and print a table:
# target, architecture, the venv's Python, file size, installed size, path.
#
#   bash scripts/build-packages.sh [--json FILE]      (make packages)
#
# Nothing is compiled: each venv gets the PyPI wheels of its release's Python and
# architecture, so one machine builds them all. Exit 1 when any build failed.
set -euo pipefail
cd "$(dirname "$0")/.."
json=""
[[ ${1:-} == --json ]] && json=$2
log() { echo "build-packages: $*" >&2; }

rows=()
failed=0
for target in $(python3 packaging/targets.py list); do
    eval "$(python3 packaging/targets.py show "$target" amd64)"
    for arch in amd64 arm64; do
        if [[ $t_format == deb ]]; then
            pkg=$(bash scripts/build-deb.sh --target "$target" --arch "$arch" | tail -1) || pkg=""
            installed=$([[ -n $pkg ]] && echo "$(dpkg-deb -f "$pkg" Installed-Size) KiB" || true)
        else
            pkg=$(bash scripts/build-rpm.sh --target "$target" --arch "$arch" | tail -1) || pkg=""
            installed=$([[ -n $pkg ]] && echo "$(( $(rpm -qp --qf '%{SIZE}' "$pkg" 2>/dev/null) / 1024 )) KiB" || true)
        fi
        if [[ -z $pkg ]]; then
            failed=1
            rows+=("$target	$arch	$t_python	FAILED		")
            continue
        fi
        rows+=("$target	$arch	$t_python	$(du -k "$pkg" | cut -f1) KiB	$installed	$pkg")
    done
done
{
    printf 'target\tarch\tpython\tfile\tinstalled\tpackage\n'
    printf '%s\n' "${rows[@]}"
} | column -t -s $'\t'
if [[ -n $json ]]; then
    printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys
keys = ("target", "arch", "python", "file", "installed", "package")
rows = [dict(zip(keys, line.rstrip("\n").split("\t"))) for line in sys.stdin if line.strip()]
json.dump(rows, open(sys.argv[1], "w"), indent=1)
' "$json"
fi
exit $failed
