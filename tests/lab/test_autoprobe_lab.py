"""[[sriov]] autoprobe = false on the lab's igb PF: sriov_drivers_autoprobe is written
before the VFs are made, so a VF without a declared driver is never bound by the host
(igbvf), and the one with a declared driver is bound by rdmad. A reboot resets the
PCI function's autoprobe to 1; a PF driver reload keeps it (the PCI device stays):
after both, the VF without a declared driver is still unbound, which it can only be
if rdmad wrote autoprobe before it wrote sriov_numvfs.
"""

from __future__ import annotations

import pytest
from harness import Guest
from service import start

pytestmark = [pytest.mark.lab, pytest.mark.timeout(1500)]


def config(pf: str) -> str:
    return (
        '[daemon]\ndrift_interval = "1h"\n\n'
        f'[[sriov]]\npf = {{ pci = "{pf}" }}\nnumvfs = 2\nautoprobe = false\n\n'
        '[[sriov.vf]]\nindex = 0\ndriver = "igbvf"\n'
    )


def drivers(g: Guest, pf: str) -> list[str]:
    """Each VF's driver, "-" when unbound."""
    out = []
    for vf in g.vf_bdfs(pf):
        link = g.run(f"readlink {g.pci_path(vf, 'driver')}")
        out.append(link.out.strip().rsplit("/", 1)[-1] if link.ok else "-")
    return out


def restored(g: Guest, pf: str, timeout: float) -> None:
    g.wait_for(f"[ $(cat /sys/bus/pci/devices/{pf}/sriov_numvfs) = 2 ]", timeout=timeout)
    g.wait_for(
        f'[ "$(basename $(readlink {g.pci_path(g.vf_bdfs(pf)[0], "driver")}))" = igbvf ]',
        timeout=timeout,
    )


@pytest.mark.lab_needs("reboot")
def test_autoprobe_off_is_written_before_the_vfs_after_a_reboot_and_a_reload(
    installed_guest: Guest,
) -> None:
    g = installed_guest
    assert g.install_rdmad().unit_installed
    pf = g.igb_pf()
    autoprobe = f"/sys/bus/pci/devices/{pf}/sriov_drivers_autoprobe"
    assert g.check(f"cat {autoprobe}").strip() == "1"  # the kernel's default
    start(g, config(pf))
    restored(g, pf, 120)
    assert g.check(f"cat {autoprobe}").strip() == "0"
    assert drivers(g, pf) == ["igbvf", "-"]

    g.check("systemctl enable rdmad.service")
    g.reboot()
    restored(g, pf, 240)
    assert g.check(f"cat {autoprobe}").strip() == "0"
    assert drivers(g, pf) == ["igbvf", "-"]  # VF 1 never had a driver

    g.check("modprobe -r igb && modprobe igb", timeout=240)
    restored(g, pf, 240)
    assert drivers(g, pf) == ["igbvf", "-"]
