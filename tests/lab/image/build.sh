#!/usr/bin/env bash
# Build the rdmad lab guest image (Debian 12, kernel 6.1, netdevsim, dummy
# nvidia modules, rdmad's runtime venv) into a cache keyed by its inputs.
# RDMAD_LAB_SUITE=trixie builds the Debian 13 guest instead (its own kernel, no
# netdevsim, dummy modules or venv: it runs only the Debian 13 .deb; make
# test-debian13-lab), in a cache directory of its own.
#
#   build.sh          build unless cached; print the image directory on stdout
#   build.sh --key    print the cache key
#   build.sh --path   print the image directory if it is built, else exit 1
#
# Cache: ${RDMAD_LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdmad-lab}/img-KEY/
# holding vmlinuz, initrd.img, rootfs.img (raw ext4) and manifest.txt. The
# directory is renamed into place only when complete, so a killed build never
# leaves a half image that looks valid. Needs root (debootstrap, chroot).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
CACHE=${RDMAD_LAB_CACHE:-${XDG_CACHE_HOME:-${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}/.cache}/rdmad-lab}
SUITE=${RDMAD_LAB_SUITE:-bookworm}
case $SUITE in
    bookworm) ;;
    trixie) CACHE=$CACHE-trixie ;;
    *) echo "build.sh: RDMAD_LAB_SUITE=$SUITE: use bookworm or trixie" >&2; exit 2 ;;
esac
VENV=/opt/rdmad/venv
# Lab-only files in the guest that no package owns (the unknown-symbol peermem).
LAB_SHARE=/usr/local/share/rdmad-lab

log() { printf '[lab-image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# A python3 that is 3.11 like the guest's, so built wheels fit the guest venv.
host_python() {
    local py
    for py in "${PYTHON:-python3}" python3.11 /usr/bin/python3; do
        if command -v "$py" >/dev/null 2>&1 \
            && "$py" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            echo "$py"
            return 0
        fi
    done
    die "need a python 3.11 (the guest's version) on the host"
}

# The guest kernel is exactly the one the host's linux-headers-amd64 points at,
# so out-of-tree modules built against those headers load in the guest.
kernel_pkg_dep() {
    dpkg-query -W -f='${Depends}' linux-headers-amd64 2>/dev/null \
        || die "linux-headers-amd64 missing: run scripts/lab-deps.sh"
}

kernel_version() {
    kernel_pkg_dep | sed -n 's/^linux-headers-\([^ ]*\).*/\1/p'
}

# Debian 13's guest: the release's own kernel (its newest linux-image-amd64), nothing
# built against it here.
trixie() { [[ $SUITE == trixie ]]; }

runtime_deps() {
    "$(host_python)" "$HERE/runtime_deps.py" "$REPO/pyproject.toml"
}

cache_key() {
    {
        echo "suite=$SUITE"
        if trixie; then echo "kernel=linux-image-amd64"; else echo "kernel=$(kernel_pkg_dep)"; fi
        echo "deps:"
        runtime_deps
        # Every file of the image recipe: this script, packages, module
        # sources, rootfs overlay, and the wrapper that calls it.
        (cd "$HERE" && find . -type f ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
            | xargs -0 sha256sum)
        sha256sum "$REPO/scripts/lab-image.sh" 2>/dev/null | cut -d' ' -f1
    } | sha256sum | cut -c1-16
}

# The Debian mirror the host already uses, from its apt sources (one script for this
# image and the container image): the project never names a mirror itself.
host_mirror() {
    local suite=${1:-$SUITE}
    # The archive that serves bookworm here serves trixie too when no source names it.
    bash "$REPO/scripts/debian-mirror.sh" "$suite" 2>/dev/null \
        || { [[ $suite == trixie* ]] && bash "$REPO/scripts/debian-mirror.sh" "${suite/trixie/bookworm}"; } \
        || die "no '$suite' source in the host's apt sources"
}

# The guest's apt sources: the host's own for bookworm (incl. security, where the
# kernel whose ABI matches linux-headers-amd64 usually lives); for trixie the same
# archives with trixie's suites.
guest_sources() {
    if ! trixie; then
        cp /etc/apt/sources.list.d/*.sources "$ROOT/etc/apt/sources.list.d/" 2>/dev/null || true
        [[ -f /etc/apt/sources.list ]] && cp /etc/apt/sources.list "$ROOT/etc/apt/sources.list"
        return 0
    fi
    printf 'Types: deb\nURIs: %s\nSuites: trixie trixie-updates\nComponents: main\n' \
        "$(host_mirror trixie)" >"$ROOT/etc/apt/sources.list.d/debian.sources"
    printf '\nTypes: deb\nURIs: %s\nSuites: trixie-security\nComponents: main\n' \
        "$(host_mirror trixie-security)" >>"$ROOT/etc/apt/sources.list.d/debian.sources"
    rm -f "$ROOT/etc/apt/sources.list"
}

# Unmount everything below $1 (deepest first); used for cleanup and for
# builds killed earlier.
umount_below() {
    local dir=$1 m
    [[ -d $dir ]] || return 0
    findmnt -rn -o TARGET | awk -v d="$dir" 'index($0, d "/") == 1' | sort -r \
        | while read -r m; do umount -l "$m" 2>/dev/null || true; done
}

remove_tree() {
    umount_below "$1"
    rm -rf --one-file-system "$1"
}

in_chroot() {
    env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root \
        DEBIAN_FRONTEND=noninteractive chroot "$ROOT" "$@"
}

apt_in_chroot() {
    in_chroot apt-get -y -q -o Dpkg::Options::=--force-confold \
        -o Dpkg::Options::=--force-confdef --no-install-recommends "$@"
}

mount_chroot() {
    mount -t proc proc "$ROOT/proc"
    mount -t sysfs sys "$ROOT/sys"
    mount --bind /dev "$ROOT/dev"
    mount -t devpts devpts "$ROOT/dev/pts"
    mkdir -p "$CACHE/debs"
    mount --bind "$CACHE/debs" "$ROOT/var/cache/apt/archives"
}

step_debootstrap() {
    local mirror
    mirror=$(host_mirror)
    log "debootstrap --variant=minbase $SUITE (mirror from host apt sources)"
    mkdir -p "$CACHE/debs/partial"
    debootstrap --variant=minbase --cache-dir="$CACHE/debs" "$SUITE" "$ROOT" "$mirror" \
        >"$WORK/debootstrap.log" 2>&1 || { tail -30 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
}

step_packages() {
    local kver=$1 pkgs
    mapfile -t pkgs < <(grep -v -e '^#' -e '^ *$' "$HERE/packages.txt")
    guest_sources
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
    chmod +x "$ROOT/usr/sbin/policy-rc.d"
    cp -a "$HERE/rootfs/." "$ROOT/"
    mount_chroot
    log "apt-get update + install ${#pkgs[@]} packages"
    in_chroot apt-get update -q >"$WORK/apt.log" 2>&1 || { tail -30 "$WORK/apt.log" >&2; die "apt-get update failed"; }
    apt_in_chroot install "${pkgs[@]}" >>"$WORK/apt.log" 2>&1 \
        || { tail -30 "$WORK/apt.log" >&2; die "package install failed"; }
    # Written after initramfs-tools is installed: this file is its conffile.
    printf '%s\n' virtio_pci virtio_blk virtio_console ext4 crc32c_generic >"$ROOT/etc/initramfs-tools/modules"
    log "installing linux-image-${kver:-amd64}"
    apt_in_chroot install "linux-image-${kver:-amd64}" >>"$WORK/apt.log" 2>&1 \
        || { tail -30 "$WORK/apt.log" >&2; die "kernel install failed"; }
    if [[ -z $kver ]]; then
        kver=$(ls "$ROOT/lib/modules")
        [[ $kver != *$'\n'* ]] || die "more than one kernel in the guest: $kver"
    fi
    [[ -f $ROOT/boot/initrd.img-$kver ]] || die "no initrd for $kver"
    echo "$kver" >"$WORK/kver"
}

step_venv() {
    local py wheels=$WORK/wheels
    py=$(host_python)
    log "building wheels of rdmad's runtime dependencies on the host"
    mkdir -p "$wheels"
    runtime_deps >"$wheels/requirements.txt"
    "$py" -m pip wheel -q -w "$wheels" -r "$wheels/requirements.txt" >"$WORK/pip.log" 2>&1 \
        || { grep -v 'is ignored' "$WORK/pip.log" | tail -30 >&2; die "pip wheel failed"; }
    log "creating $VENV in the chroot with the guest's python3"
    mkdir -p "$ROOT/tmp/wheels"
    mount --bind "$wheels" "$ROOT/tmp/wheels"
    in_chroot python3 -m venv "$VENV"
    in_chroot "$VENV/bin/pip" install -q --no-index --find-links /tmp/wheels \
        -r /tmp/wheels/requirements.txt >>"$WORK/pip.log" 2>&1 \
        || { tail -30 "$WORK/pip.log" >&2; die "pip install in the chroot failed"; }
    umount "$ROOT/tmp/wheels"
    rmdir "$ROOT/tmp/wheels"
    # TCG is slow: compile every .pyc now, not at each import in the guest.
    in_chroot "$VENV/bin/python" -m compileall -q -j0 "$VENV/lib" >/dev/null \
        || log "warning: compileall reported errors in the venv"
    in_chroot python3 -m compileall -q -j0 /usr/lib/python3.11 >/dev/null 2>&1 || true
    in_chroot "$VENV/bin/pip" freeze >"$OUT/venv-freeze.txt"
}

step_modules() {
    local kver=$1 hdr=/usr/src/linux-headers-$1 extra=$ROOT/lib/modules/$1/extra
    [[ -d $hdr ]] || die "$hdr missing: run scripts/lab-deps.sh"
    local src=/usr/src/linux-source-6.1.tar.xz
    [[ -f $src ]] || die "$src missing: run scripts/lab-deps.sh"
    log "building netdevsim (out of tree, from linux-source-6.1) and dummy nvidia modules"
    mkdir -p "$WORK/nsim" "$WORK/dummy" "$extra"
    tar -xJf "$src" -C "$WORK/nsim" --strip-components=4 \
        linux-source-6.1/drivers/net/netdevsim
    make -s -C "$hdr" M="$WORK/nsim" CONFIG_NETDEVSIM=m modules >"$WORK/make.log" 2>&1 \
        || { tail -30 "$WORK/make.log" >&2; die "netdevsim build failed"; }
    cp "$HERE"/modules/*.c "$HERE/modules/Kbuild" "$WORK/dummy/"
    make -s -C "$hdr" M="$WORK/dummy" modules >>"$WORK/make.log" 2>&1 \
        || { tail -30 "$WORK/make.log" >&2; die "dummy module build failed"; }
    install -m 0644 "$WORK/nsim/netdevsim.ko" "$WORK/dummy/nvidia.ko" \
        "$WORK/dummy/nvidia-peermem.ko" "$extra/"
    # The same peermem calling a symbol nobody exports (modpost would refuse it: warn
    # only), outside /lib/modules: a test puts it in place of the real one.
    mkdir -p "$WORK/badsym" "$ROOT$LAB_SHARE"
    cp "$HERE/modules/nvidia-peermem.c" "$WORK/badsym/"
    printf 'obj-m := nvidia-peermem.o\nccflags-y := -DLAB_UNKNOWN_SYMBOL\n' >"$WORK/badsym/Kbuild"
    make -s -C "$hdr" M="$WORK/badsym" KBUILD_MODPOST_WARN=1 modules >>"$WORK/make.log" 2>&1 \
        || { tail -30 "$WORK/make.log" >&2; die "unknown-symbol peermem build failed"; }
    install -m 0644 "$WORK/badsym/nvidia-peermem.ko" "$ROOT$LAB_SHARE/nvidia-peermem-unknown-symbol.ko"
    in_chroot depmod -a "$kver"
    in_chroot modinfo -k "$kver" -F depends nvidia-peermem | grep -q ib_core \
        || die "nvidia-peermem does not depend on ib_core"
}

step_configure() {
    log "configuring the guest (units, root login on ttyS0, machine-id)"
    in_chroot systemctl enable rdmad-lab-boot-done.service rdmad-lab-nic.service >/dev/null 2>&1
    # Nothing in a lab boot needs these; they only cost TCG time.
    in_chroot systemctl mask e2scrub_all.timer e2scrub_reap.service getty-static.service \
        apt-daily.timer apt-daily-upgrade.timer >/dev/null 2>&1 || true
    in_chroot passwd -d root >/dev/null
    # A fixed machine-id: an empty one would make every boot a "first boot".
    od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$ROOT/etc/machine-id"
    mkdir -p "$ROOT/mnt/src" "$ROOT/opt/rdmad"
    rm -f "$ROOT/usr/sbin/policy-rc.d"
}

step_image() {
    local kver=$1 mb
    umount_below "$ROOT"
    rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin "$ROOT"/tmp/*
    cp "$ROOT/boot/vmlinuz-$kver" "$OUT/vmlinuz"
    cp "$ROOT/boot/initrd.img-$kver" "$OUT/initrd.img"
    chmod 0644 "$OUT/vmlinuz" "$OUT/initrd.img"
    mb=$(( $(du -sm "$ROOT" | cut -f1) + 1024 ))
    log "making a ${mb} MB ext4 image"
    truncate -s "${mb}M" "$OUT/rootfs.img"
    mkfs.ext4 -q -F -L rdmad-lab -m 0 -d "$ROOT" "$OUT/rootfs.img"
    {
        echo "key=$KEY"
        echo "kernel=$kver"
        echo "built=$(date -u +%FT%TZ)"
        echo "python=$(in_chroot_py_version)"
    } >"$OUT/manifest.txt"
}

in_chroot_py_version() {
    readlink "$ROOT/usr/bin/python3" || true
}

build() {
    local kver="" started=$SECONDS
    if ! trixie; then
        kver=$(kernel_version)
        [[ -n $kver ]] || die "cannot tell the guest kernel version"
    fi
    [[ $(id -u) -eq 0 ]] || die "building the image needs root (debootstrap, chroot)"
    mkdir -p "$CACHE"
    # Builds killed earlier (even by SIGKILL) leave only .build-* dirs.
    local stale
    for stale in "$CACHE"/.build-*; do
        [[ -e $stale ]] && { log "removing stale $stale"; remove_tree "$stale"; }
    done
    WORK=$CACHE/.build-$KEY-$$
    ROOT=$WORK/root
    OUT=$WORK/out
    mkdir -p "$ROOT" "$OUT"
    trap 'remove_tree "$WORK"' EXIT
    trap 'exit 130' INT TERM
    log "building image $KEY ($SUITE, kernel ${kver:-linux-image-amd64}) in $WORK"
    step_debootstrap
    step_packages "$kver"
    kver=$(cat "$WORK/kver")
    if trixie; then
        log "$SUITE: no netdevsim, dummy modules or venv (the guest runs the .deb only)"
        in_chroot sh -c 'python3 -m compileall -q -j0 "$(python3 -c "import sysconfig; print(sysconfig.get_path(\"stdlib\"))")"' \
            >/dev/null 2>&1 || true
    else
        step_modules "$kver"
        step_venv
    fi
    step_configure
    step_image "$kver"
    sync
    mv -T "$OUT" "$CACHE/img-$KEY"
    # Only the newest image is kept: each one is about 1.5 GB.
    local old
    for old in "$CACHE"/img-*; do
        [[ $old == "$CACHE/img-$KEY" ]] || rm -rf --one-file-system "$old"
    done
    log "image ready in $((SECONDS - started)) s: $CACHE/img-$KEY"
}

main() {
    KEY=$(cache_key)
    local img=$CACHE/img-$KEY
    case "${1:-}" in
        --key) echo "$KEY"; return 0 ;;
        --path)
            [[ -f $img/rootfs.img ]] || exit 1
            echo "$img"
            return 0
            ;;
        "") ;;
        *) die "usage: build.sh [--key|--path]" ;;
    esac
    if [[ -f $img/rootfs.img ]]; then
        log "image $KEY is cached: $img"
    else
        build
    fi
    echo "$img"
}

main "$@"; exit $?  # one line: bash reads scripts lazily, edits while running must not matter
