#!/usr/bin/env bash
# Install what the QEMU lab (tests/lab) needs on a Debian 12 host. Run as root.
# Idempotent: a no-op (no apt-get update) when everything is already present.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive

if [[ $(id -u) -ne 0 ]]; then
    echo "lab-deps: must run as root" >&2
    exit 1
fi

SOURCES=/etc/apt/sources.list.d/debian.sources

# Packages installed from bookworm itself. linux-headers-amd64 pins the guest
# kernel ABI: the image installs exactly the linux-image matching these headers.
BASE_PKGS=(debootstrap zstd e2fsprogs build-essential linux-headers-amd64
           linux-source-6.1 xz-utils kmod python3-pip ca-certificates)

log() { echo "lab-deps: $*" >&2; }

missing_base() {
    local p
    for p in "${BASE_PKGS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || echo "$p"
    done
}

# QEMU >= 10 is needed for the emulated igb NIC (bookworm's 7.2 lacks it).
qemu_ok() {
    command -v qemu-system-x86_64 >/dev/null 2>&1 || return 1
    local major
    major=$(qemu-system-x86_64 --version | sed -n 's/^QEMU emulator version \([0-9]*\).*/\1/p')
    [[ -n $major && $major -ge 8 ]] \
        && qemu-system-x86_64 -device help 2>/dev/null | grep -q '"igb"'
}

# Add bookworm-backports to the existing Suites: line (never write a mirror host).
ensure_backports() {
    if grep -Eq '^Suites:.*\bbookworm-backports\b' "$SOURCES" 2>/dev/null; then
        return 1
    fi
    if [[ ! -f $SOURCES ]] || ! grep -Eq '^Suites:.*\bbookworm\b( |$)' "$SOURCES"; then
        log "no 'Suites: bookworm' line in $SOURCES; add bookworm-backports yourself"
        exit 1
    fi
    log "adding bookworm-backports to $SOURCES"
    sed -i -E '0,/^Suites:(.*\bbookworm\b( |$).*)$/s//Suites:\1 bookworm-backports/' "$SOURCES"
    sed -i -E 's/^(Suites:.*) +$/\1/' "$SOURCES"
    return 0
}

main() {
    local need_update=0
    ensure_backports && need_update=1
    mapfile -t missing < <(missing_base)
    local need_qemu=0
    qemu_ok || need_qemu=1
    if [[ ${#missing[@]} -eq 0 && $need_qemu -eq 0 && $need_update -eq 0 ]]; then
        log "all present"
        return 0
    fi
    log "apt-get update"
    apt-get update -qq
    if [[ ${#missing[@]} -gt 0 ]]; then
        log "installing: ${missing[*]}"
        apt-get install -y -qq --no-install-recommends "${missing[@]}"
    fi
    if [[ $need_qemu -eq 1 ]]; then
        log "installing qemu-system-x86 from bookworm-backports"
        apt-get install -y -qq --no-install-recommends -t bookworm-backports \
            qemu-system-x86 qemu-system-data ipxe-qemu seabios
    fi
    qemu_ok || { log "qemu-system-x86_64 with igb still missing"; exit 1; }
    log "done: $(qemu-system-x86_64 --version | head -1)"
}

main "$@"
