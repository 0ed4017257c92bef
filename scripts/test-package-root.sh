#!/usr/bin/env bash
# A .deb installed and run in a Debian root of its release and architecture: the arm64
# package in an arm64 Debian 12 root under user-mode emulation (qemu-user-static), the
# Debian 13 package in a Debian 13 root. Checks `rdmad --version`, `check-config`,
# `plan --root` and `rdmad-ctl doctor --root` on the demo's made-up node, and the
# daemon itself (`run --dry-run --root`) answering `rdmad-ctl status` and doing passes.
#
#   bash scripts/test-package-root.sh arm64 [--json FILE]     (make test-arm64)
#   bash scripts/test-package-root.sh debian13 [--json FILE]  (make test-debian13)
#
# Root needed. Each Debian root is made once with debootstrap from the archive this
# machine's apt uses (cached). For arm64 the emulator is registered with binfmt_misc
# under a name of its own, rdmad-aarch64, only when no aarch64 handler is registered,
# and unregistered on exit; mounts live in a private mount namespace. Prints one line
# per check and exits 1 when any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "test-package-root: $*" >&2; }
case ${1:-} in
    arm64) target=debian12 arch=arm64 suite=bookworm python=python3.11 ;;
    debian13) target=debian13 arch=amd64 suite=trixie python=python3.13 ;;  # as test-pythons.sh
    *) log "usage: test-package-root.sh arm64|debian13 [--json FILE]"; exit 2 ;;
esac
shift
json=""
[[ ${1:-} == --json ]] && json=$2
[[ $(id -u) -eq 0 ]] || { log "run as root (debootstrap, binfmt_misc, chroot)"; exit 1; }
[[ $(dpkg --print-architecture) == amd64 ]] || { log "made for an amd64 machine"; exit 1; }
foreign=0
[[ $arch != amd64 ]] && foreign=1

need=()
((foreign)) && ! command -v qemu-aarch64-static >/dev/null && need+=(qemu-user-static)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
    log "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# binfmt_misc: the kernel runs aarch64 ELF files through the static emulator. "F"
# opens the emulator now, so it needs not exist inside the root.
binfmt=/proc/sys/fs/binfmt_misc
mounted_binfmt=0
registered=0
cleanup() {
    ((registered)) && echo -1 >"$binfmt/rdmad-aarch64" || true
    ((mounted_binfmt)) && umount "$binfmt" || true
}
trap cleanup EXIT
if ((foreign)); then
    if [[ ! -e $binfmt/register ]]; then
        mount -t binfmt_misc binfmt_misc "$binfmt"
        mounted_binfmt=1
    fi
    if ! grep -qs "qemu-aarch64" "$binfmt"/* 2>/dev/null; then
        # ELF64, little endian, e_machine 183 (AArch64), executable or shared object.
        magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
        mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
        echo ":rdmad-aarch64:M::$magic:$mask:$(command -v qemu-aarch64-static):F" >"$binfmt/register"
        registered=1
    fi
fi

# The trixie root serves scripts/test-pythons.sh too: the same packages for both.
packages="$python,kmod,systemd,libudev1"
[[ $suite == trixie ]] && packages+=",python3-venv,ca-certificates,curl"
root=$(bash scripts/debian-root.sh "$suite" "$arch" "$packages")

log "the .deb (scripts/build-deb.sh --target $target --arch $arch)"
deb=$(bash scripts/build-deb.sh --target "$target" --arch "$arch" | tail -1)

# The made-up node of the demo (tests/support/fakesysfs.py) and its declaration, built
# here and copied in: the root has no rdmad source tree.
work=$root/tmp/rdmad-pkg
rm -rf "$work"
mkdir -p "$work/etc/rdmad.d"
python3 -m tests.support.fakesysfs "$work/node"
cp tests/fixtures/demo-node.toml "$work/etc/rdmad.d/50-demo.toml"
cat >"$work/etc/rdmad.toml" <<'TOML'
[daemon]
state_dir = "/tmp/rdmad-pkg/state"
[api]
socket = "/tmp/rdmad-pkg/rdmad.sock"
TOML
cp "$deb" "$work/rdmad.deb"

# Each check: a name, and a command run in the root; its output goes to the log.
cat >"$work/checks.sh" <<'SH'
#!/bin/sh
# Runs inside the root: prints "ok NAME" or "FAIL NAME". $1: the release's python.
w=/tmp/rdmad-pkg
py=$1
check() {
    name=$1; shift
    if "$@" >"$w/$name.out" 2>&1; then echo "ok $name"; else echo "FAIL $name (exit $?)"; fi
}
machine() {  # the ELF machine of the bundled msgspec: this root's architecture
    want=$(case $(dpkg --print-architecture) in arm64) echo b700 ;; amd64) echo 3e00 ;; esac)
    got=$(od -An -tx1 -j18 -N2 /usr/lib/rdmad/lib/$py/site-packages/msgspec/_core*.so | tr -d ' ')
    [ "$got" = "$want" ]
}
check install dpkg -i $w/rdmad.deb
check wheels-of-this-arch machine
check bytecode sh -c "ls /usr/lib/rdmad/lib/$py/site-packages/rdmad/__pycache__/*.pyc >/dev/null"
check version sh -c 'rdmad --version | grep -qx "rdmad $(dpkg-query -W -f "\${Version}" rdmad | cut -d- -f1)"'
check check-config-package rdmad check-config --config /etc/rdmad
check check-config-demo rdmad check-config --config $w/etc
check plan-fake-node sh -c "rdmad plan --local --root $w/node --config $w/etc | grep -q numvfs"
check doctor-fake-node sh -c "rdmad-ctl doctor --root $w/node --config $w/etc --json >$w/doctor.json; [ \$? -le 1 ] && $py -c 'import json,sys; json.load(open(\"$w/doctor.json\"))'"
rdmad run --dry-run --root $w/node --config $w/etc --log-format json >$w/daemon.log 2>&1 &
pid=$!
check daemon-ready sh -c "for i in \$(seq 1 240); do [ -S $w/rdmad.sock ] && rdmad-ctl --socket $w/rdmad.sock status >/dev/null 2>&1; rc=\$?; [ \$rc -le 1 ] && [ -S $w/rdmad.sock ] && exit 0; sleep 0.5; done; exit 1"
check daemon-passes sh -c "rdmad-ctl --socket $w/rdmad.sock reconcile --wait 120 >$w/reconcile1.out; rdmad-ctl --socket $w/rdmad.sock reconcile --wait 120 >$w/reconcile2.out; rdmad-ctl --socket $w/rdmad.sock --json status | $py -c 'import json,sys; d=json.load(sys.stdin); objs={o[\"obj\"] for o in d[\"objects\"]}; sys.exit(0 if \"sriov pci=0000:3b:00.0\" in objs else 1)'"
check daemon-plan sh -c "rdmad-ctl --socket $w/rdmad.sock plan | grep -q numvfs"
kill -TERM $pid
check daemon-exit wait $pid
check node-unchanged sh -c "[ \$(cat $w/node/sys/bus/pci/devices/0000:5e:00.0/sriov_numvfs) = 0 ]"
SH
chmod +x "$work/checks.sh"

log "running the checks in the $suite $arch root"
results=$(unshare --mount --fork sh -euc '
    root=$1
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs run "$root/run"
    chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 /tmp/rdmad-pkg/checks.sh "$2"
' sh "$root" "$python")
echo "$results"
if [[ -n $json ]]; then
    echo "$results" | python3 -c '
import json, sys
rows = [{"check": ln.split()[1], "ok": ln.startswith("ok ")} for ln in sys.stdin if ln.strip()]
json.dump({"deb": sys.argv[2], "root": sys.argv[3], "checks": rows}, open(sys.argv[1], "w"), indent=1)
' "$json" "$(basename "$deb")" "$suite $arch"
fi
if grep -q '^FAIL' <<<"$results"; then
    log "failed; outputs in $work/*.out and $work/daemon.log"
    exit 1
fi
# Installed again on the next run: the root stays as debootstrap made it.
chroot "$root" dpkg --purge rdmad >/dev/null 2>&1 || true
log "all checks passed"
