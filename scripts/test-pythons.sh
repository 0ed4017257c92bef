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
command -v debootstrap >/dev/null || {
    log "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
}

SUITES=(tests/unit tests/ctl tests/api)
# The same root as scripts/test-package-root.sh debian13 (same packages).
root=$(bash scripts/debian-root.sh trixie amd64 python3.13,kmod,systemd,libudev1,python3-venv,ca-certificates,curl)
version=$(chroot "$root" python3.13 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
log "Python $version (Debian 13)"

rm -rf "$root/src"
mkdir -p "$root/src"
bash scripts/tree-files.sh | tar --null -T - -cf - | tar -C "$root/src" -xf -
cp /etc/resolv.conf "$root/etc/resolv.conf"
# This machine's trust store, for pip in the root: the root's own ca-certificates does
# not have a CA the machine adds (a TLS-inspecting proxy's, on some networks).
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/rdmad-host-ca.pem"

# PIP_* of this machine name its own paths; the root has none of them.
unshare --mount --fork env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
    PIP_CERT=/etc/rdmad-host-ca.pem \
    sh -euc '
    root=$1; shift
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs tmp "$root/tmp"
    chroot "$root" sh -euc "
        [ -x /venv/bin/python ] || python3.13 -m venv /venv
        cd /src
        /venv/bin/pip install -q --disable-pip-version-check -e \".[test]\" \"argparse-manpage>=4.5,<5\"
        exec /venv/bin/python -m pytest -q -p no:cacheprovider \"\$@\"
    " pytest "$@"
' sh "$root" "${SUITES[@]}" "$@"
