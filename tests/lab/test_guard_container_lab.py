"""The driver guard of rdmad in a container (the Kubernetes DaemonSet), on the lab's kernel.

rdmad runs from the package's files in a mount namespace of its own (``unshare -m``,
the way a container sees its image: /usr/lib/rdmad is there), with the DaemonSet's
``--guard-kit /var/lib/rdmad/guard``. In the host's namespace /usr/lib/rdmad is then
hidden under an empty directory: the host has no rdmad package, and `modprobe -r igb`
runs there. Each read back from the kernel:

* a VF's vfio group held open: `modprobe -r igb` is refused, naming the holder (the
  guard's copy judged it, with the host's python3);
* the holder gone: allowed, and rdmad restores the VFs once igb is back;
* rdmad stopped (SIGTERM: the pod deleted): the hook file is gone, unloads are plain;
* rdmad killed (a crashed pod): the hook stays and still refuses while a VF is held;
* the copy deleted (a wiped host directory): the unload goes ahead, and the journal
  says the guard could not judge it;
* a kit directory anyone can write: rdmad does not start, says why, writes no hook.
"""

from __future__ import annotations

import pytest
from harness import Guest
from service import stop_and_forget

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1200)]

HOOK = "/etc/modprobe.d/rdmad-guard.conf"
KIT = "/var/lib/rdmad/guard"
CONFIG = "/etc/rdmad-container"
EMPTY = "/run/rdmad-lab-empty"


def unload_igb(g: Guest) -> tuple[bool, str]:
    res = g.run("modprobe -r igb", timeout=240)
    return res.ok, res.out + res.err


def start_container(g: Guest) -> str:
    """rdmad as the DaemonSet runs it, in a mount namespace of its own (private: the
    host's later mounts do not reach it)."""
    return g.start_unit(
        "lab-rdmad-container",
        "exec unshare --mount --propagation private /usr/bin/rdmad run --foreground "
        f"--guard-kit {KIT} --config {CONFIG} --log-format json",
        max_seconds=1100,
    )


@pytest.fixture
def container_guest(guest: Guest) -> Guest:
    assert guest.install_rdmad().unit_installed
    stop_and_forget(guest)  # the packaged unit is not what runs here
    pf = guest.igb_pf()
    guest.check(
        f"mkdir -p {CONFIG} && cat > {CONFIG}/rdmad.toml",
        stdin=(
            '[daemon]\ndrift_interval = "2s"\n'
            f'[api]\nread_group = "0"\n\n[[sriov]]\npf = {{ pci = "{pf}" }}\nnumvfs = 2\n'
        ).encode(),
    )
    return guest


def hide_package_on_host(g: Guest) -> None:
    """The host's namespace without rdmad's files (the container keeps its own view)."""
    g.check(f"mkdir -p {EMPTY} && mount --bind {EMPTY} /usr/lib/rdmad")
    assert g.run("test -e /usr/lib/rdmad/bin/python3").rc != 0


def test_guard_from_a_container_judges_on_a_host_without_the_package(
    container_guest: Guest,
) -> None:
    g = container_guest
    pf = g.igb_pf()
    unit = start_container(g)
    g.wait_for(f"grep -q '^remove igb .*exec /bin/sh {KIT}/hook remove igb$' {HOOK}", 300)
    g.wait_for(f"[ $(cat /sys/bus/pci/devices/{pf}/sriov_numvfs) = 2 ]", 180)
    hide_package_on_host(g)

    # --- a VF held: refused by the copy, run with the host's python3 -------------------
    vf1 = g.vf_bdfs(pf)[1]
    group = g.bind_vfio(vf1)
    holder, pid = g.hold_open(f"/dev/vfio/{group}")
    try:
        ok, words = unload_igb(g)
        assert not ok, words
        assert f"pid {pid} (sleep) holds /dev/vfio/{group}" in words, words
        assert g.module_loaded("igb") and g.numvfs(pf) == 2
    finally:
        g.stop_unit(holder)

    # --- free: allowed; the container's rdmad restores the VFs once igb is back --------
    ok, words = unload_igb(g)
    assert ok, words
    assert not g.module_loaded("igb")
    g.check("modprobe igb", timeout=180)
    g.wait_for(f"[ $(cat /sys/bus/pci/devices/{pf}/sriov_numvfs) = 2 ]", 240)

    # --- the pod deleted: rdmad removes the hook on its way out ------------------------
    g.stop_unit(unit)
    g.wait_for(f"! test -e {HOOK}", 120)

    # --- a crashed pod: the hook stays and still judges -------------------------------
    g.check("umount /usr/lib/rdmad")  # the next container's view: the image's files
    unit = start_container(g)
    g.wait_for(f"grep -q '{KIT}/hook' {HOOK}", 300)
    g.wait_for(f"[ $(cat /sys/bus/pci/devices/{pf}/sriov_numvfs) = 2 ]", 240)
    hide_package_on_host(g)
    g.check(f"systemctl kill -s KILL {unit}; systemctl stop {unit}; true", timeout=60)
    assert g.run(f"test -e {HOOK}").ok
    group = g.bind_vfio(g.vf_bdfs(pf)[1])
    holder, pid = g.hold_open(f"/dev/vfio/{group}")
    try:
        ok, words = unload_igb(g)
        assert not ok and f"pid {pid} (sleep)" in words, words
    finally:
        g.stop_unit(holder)

    # --- the copy deleted (a wiped host directory): it cannot judge, so the unload goes
    # ahead, and the journal says why. (Not with a holder: the kernel would wait for it.)
    g.check(f"rm -rf {KIT}/rdmad-*")
    ok, words = unload_igb(g)
    assert ok, words
    assert not g.module_loaded("igb")
    logged = g.check("journalctl -b -t rdmad-guard --no-pager -o cat", timeout=60)
    assert "cannot judge 'modprobe -r igb' (its copy" in logged + words, logged + words


def test_a_kit_directory_others_can_write_is_refused(container_guest: Guest) -> None:
    """Root's modprobe would run what is in the kit: a directory anyone can write is
    refused (rdmad does not start, the journal says why) and no hook points at it."""
    g = container_guest
    g.check(f"mkdir -p {KIT} && chmod 0777 {KIT}")
    unit = start_container(g)
    g.wait_for(f"! systemctl is-active -q {unit}", 300)
    logged = g.check(f"journalctl -b -u {unit} --no-pager -o cat", timeout=60)
    assert "guard_kit.failed" in logged, logged
    assert f"{KIT} is writable by its group or by all (mode 0777)" in logged, logged
    assert g.run(f"test -e {HOOK}").rc != 0
    assert g.check(f"ls -A {KIT}").strip() == ""  # nothing copied into it
