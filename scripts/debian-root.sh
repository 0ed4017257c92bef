#!/usr/bin/env bash
# Make (once; cached) a minimal Debian root of a suite and architecture with some
# packages, from the archive this machine's apt uses, and print its path.
#
#   bash scripts/debian-root.sh SUITE ARCH PACKAGE[,PACKAGE...]
#
# For a foreign architecture the caller has registered its emulator with binfmt_misc
# (scripts/test-package-root.sh). The root is remade when a package is missing from
# it. Root needed (debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."
suite=$1 arch=$2 packages=$3
log() { echo "debian-root: $*" >&2; }
cache=${RDMAD_CACHE_DIR:-$HOME/.cache/rdmad-lab}
root=$cache/$suite-$arch
have() {
    local p
    for p in ${packages//,/ }; do
        grep -qx "Package: $p" "$root/var/lib/dpkg/status" 2>/dev/null || return 1
    done
}
if ! have; then
    # The archive that serves bookworm here serves trixie too when no source names it.
    mirror=$(bash scripts/debian-mirror.sh "$suite" 2>/dev/null || bash scripts/debian-mirror.sh bookworm)
    log "debootstrap $suite $arch with $packages into $root (minutes; emulated: longer)"
    rm -rf "$root.tmp"
    mkdir -p "$cache"
    { debootstrap --arch="$arch" --foreign --variant=minbase --include="$packages" \
        "$suite" "$root.tmp" "$mirror" &&
        chroot "$root.tmp" /debootstrap/debootstrap --second-stage; } >"$cache/$suite-$arch.log" 2>&1 || {
        tail -20 "$cache/$suite-$arch.log" >&2
        log "debootstrap failed (log above)"
        exit 1
    }
    rm -rf "$root"
    mv "$root.tmp" "$root"
fi
echo "$root"
