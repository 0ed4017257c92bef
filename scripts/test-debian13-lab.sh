#!/usr/bin/env bash
# The Debian 13 package on Debian 13's own kernel: a trixie lab guest (built once,
# cached apart from the lab's bookworm image) installs the ~deb13 .deb offline and
# runs the lab tests that say a node is right: the package's life (install, VFs with
# their settings and an rxe link, reboot, upgrade, remove, purge), VFs restored after
# a reboot and after a PF driver reload, a VF in use left alone, rxe re-created by
# events and after a module reload, rdma_cm traffic over the restored links.
# Root and QEMU, like the lab; not in CI (an image of its own: minutes). Extra
# arguments go to pytest. The last result is in README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/lab-deps.sh
bash scripts/pkg-deps.sh
export RDMAD_LAB_SUITE=trixie RDMAD_TESTS_REQUIRED=1
bash scripts/lab-image.sh >/dev/null
exec .venv/bin/python -m pytest -p no:cacheprovider -q -rfE \
    tests/lab/test_package_lab.py \
    tests/lab/test_sriov_persistence.py::test_igb_restored_after_reboot_and_driver_reload \
    tests/lab/test_sriov_persistence.py::test_igb_vfs_converge_and_a_hand_set_mac_is_restored \
    tests/lab/test_sriov_persistence.py::test_vf_in_use_is_untouched_in_every_way_and_its_rebind_deferred \
    tests/lab/test_rxe_persistence.py::test_virtio_rxe_recreated_by_event_and_after_module_reload \
    tests/lab/test_rdma_cm_lab.py \
    "$@"
