#!/usr/bin/env bash
# Run the suites that need no kernel, lab or root tools on every Python the package
# registries give this machine: its own (Debian 12: 3.11, the main test run) and
# Debian 13's 3.13, in a trixie root made with debootstrap from the archive this
# machine's apt uses (cached). Python 3.10, the lowest supported, has no Debian
# release: it is checked statically (mypy as 3.10, ruff's py310 target).
#
#   bash scripts/test-pythons.sh [PYTEST ARGS...]     (root; make test-pythons)
#
# The tree is copied into the root (what git would commit), installed into a venv
# there from PyPI with its test extras, and run in a private mount namespace: /proc
# and /dev are mounted for the run and gone with it.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "test-pythons: $*" >&2; }
[[ $(id -u) -eq 0 ]] || { log "run as root (debootstrap, chroot)"; exit 1; }
command -v debootstrap >/dev/null || { log "debootstrap is missing (apt-get install debootstrap)"; exit 1; }

SUITES=(tests/unit tests/ctl tests/api)
cache=${RDMAD_CACHE_DIR:-$HOME/.cache/rdmad-lab}
root=$cache/trixie-python
# The archive that serves bookworm here serves trixie too when no source names it.
mirror=$(bash scripts/debian-mirror.sh trixie 2>/dev/null || bash scripts/debian-mirror.sh bookworm)

if [[ ! -x $root/usr/bin/python3 ]]; then
    log "debootstrap trixie (python3, venv) into $root"
    rm -rf "$root.tmp"
    mkdir -p "$cache"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
        trixie "$root.tmp" "$mirror" >"$cache/trixie-python.log" 2>&1 || {
        tail -20 "$cache/trixie-python.log" >&2
        log "debootstrap failed (log above)"
        exit 1
    }
    rm -rf "$root"
    mv "$root.tmp" "$root"
fi
version=$(chroot "$root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
log "Python $version (Debian 13)"

rm -rf "$root/src"
mkdir -p "$root/src"
git ls-files -z --cached --others --exclude-standard |
    xargs -0 -I{} sh -c '[ -f "{}" ] && printf "%s\0" "{}"' | tar --null -T - -cf - |
    tar -C "$root/src" -xf -
cp /etc/resolv.conf "$root/etc/resolv.conf"

# PIP_* of this machine name its own paths; the root has none of them.
unshare --mount --fork env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    sh -euc '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmp "$root/tmp"
    chroot "$root" sh -euc "
        [ -x /venv/bin/python ] || python3 -m venv /venv
        cd /src
        /venv/bin/pip install -q --disable-pip-version-check -e \".[test]\" \"argparse-manpage>=4.5,<5\"
        exec /venv/bin/python -m pytest -q -p no:cacheprovider \"\$@\"
    " pytest "$@"
' sh "$root" "${SUITES[@]}" "$@"
