#!/usr/bin/env bash
# Build rdmad's .deb and show its main job on a real kernel: boot a QEMU lab guest
# (Debian 12, kernel 6.1, emulated igb SR-IOV NIC, no network), install the .deb
# with apt (dependencies offline, from the image), declare 4 VFs with settings and
# an rxe link, show `rdmad-ctl status`, reboot the guest and reload the PF driver,
# and show everything restored with the time it took.
#
#   bash scripts/demo.sh          the lab demo (root; installs QEMU and the package tools,
#                                 builds the guest image and the .deb once, then cached)
#   bash scripts/demo.sh --plan   quick: plan against a fake mlx5 + igb sysfs tree (no root, no QEMU)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

plan_demo() {
    # Global, not local: the EXIT trap runs after this function has returned.
    demo_root=$(mktemp -d)
    trap 'rm -rf "$demo_root"' EXIT
    local root=$demo_root
    .venv/bin/python -m tests.support.fakesysfs "$root"
    echo "\$ rdmad check-config --config tests/fixtures/demo-node.toml"
    .venv/bin/rdmad check-config --config tests/fixtures/demo-node.toml
    echo
    echo "\$ rdmad plan --root <fake node> --config tests/fixtures/demo-node.toml"
    .venv/bin/rdmad plan --root "$root" --config tests/fixtures/demo-node.toml
}

if [[ ${1:-} == --plan ]]; then
    plan_demo
    exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "demo: the lab demo needs root (QEMU, debootstrap); showing the plan demo instead" >&2
    plan_demo
    exit 0
fi
echo "== lab: host packages and guest image (first run: a few minutes, then cached)"
bash scripts/lab-deps.sh
bash scripts/lab-image.sh
if [[ ${RDMAD_LAB_INSTALL:-package} == package ]]; then
    echo "== the .deb (dpkg-buildpackage from a copy of this tree; cached by its inputs)"
    bash scripts/pkg-deps.sh
    bash scripts/build-deb.sh
fi
echo "== lab demo"
.venv/bin/python tests/lab/demo.py "$@"
