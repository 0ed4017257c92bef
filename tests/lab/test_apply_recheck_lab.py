"""The re-check before a destructive write, on the real kernel.

A plan is made while a VF or an rxe link is free; a user appears before the write
runs. KernelHost re-reads the value and the usage right before writing and drops
the action as stale: nothing is written, the user is unharmed.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_kernel_host_lab import run_in_guest  # type: ignore[import-not-found]

pytestmark = pytest.mark.lab


def test_numvfs_write_dropped_when_a_vm_took_a_vf_since_the_plan(guest: Any) -> None:
    made = run_in_guest(
        guest,
        """
        async def main():
            pci = igb_pf()
            async with KernelHost() as host:
                now = pf_of(await host.observe(), pci).numvfs
                await host.apply(SetNumVfs("o", "lab", pci=pci, old=now, new=0))
                await host.apply(SetNumVfs("o", "lab", pci=pci, old=0, new=1))
                obs = await until(host, lambda o: len(pf_of(o, pci).vfs) == 1, "1 VF")
                vf = pf_of(obs, pci).vf(0)
                r = await host.apply(BindVfDriver("o", "lab", vf_pci=vf.pci, old=vf.driver,
                                                  new="vfio-pci", load_module=True))
                return {"pf": pci, "vf": vf.pci, "bind": result_json(r)}
        """,
    )
    assert made["bind"]["outcome"] == "applied", made
    pf, vf = made["pf"], made["vf"]
    group = guest.check(f"basename $(readlink /sys/bus/pci/devices/{vf}/iommu_group)").strip()
    # The plan "numvfs 1 -> 0" was made while the VF was free; now a VM opens its group.
    unit, pid = guest.hold_open(f"/dev/vfio/{group}")
    try:
        verdict = run_in_guest(
            guest,
            f"""
            async def main():
                async with KernelHost() as host:
                    r = await host.apply(SetNumVfs("o", "planned while free", pci={pf!r},
                                                   old=1, new=0))
                    return {{"outcome": r.outcome.value, "note": r.note,
                             "records": len(host.records)}}
            """,
        )
        assert verdict["outcome"] == "stale", verdict
        assert f"pid {pid} " in verdict["note"] and f"/dev/vfio/{group}" in verdict["note"]
        assert verdict["records"] == 0  # nothing was written
        assert guest.check(f"cat /sys/bus/pci/devices/{pf}/sriov_numvfs").strip() == "1"
        assert guest.check(f"basename $(readlink /sys/bus/pci/devices/{vf}/driver)").strip() == (
            "vfio-pci"
        )
        assert guest.run(f"kill -0 {pid}").rc == 0  # the holder is alive
    finally:
        guest.stop_unit(unit)


def test_rxe_delete_dropped_when_a_verbs_user_appeared(guest: Any) -> None:
    guest.check("ip link add labrc0 type veth peer name labrc1")
    made = run_in_guest(
        guest,
        """
        async def main():
            async with KernelHost() as host:
                r = await host.apply(AddRxe("rxe rxerc", "lab", name="rxerc", netdev="labrc0"))
                return {"add": result_json(r)}
        """,
    )
    assert made["add"]["outcome"] == "applied", made
    uverbs = guest.check(
        "for d in /sys/class/infiniband_verbs/uverbs*; do "
        '[ "$(cat $d/ibdev)" = rxerc ] && basename $d; done'
    ).strip()
    assert uverbs.startswith("uverbs"), uverbs
    unit, pid = guest.hold_open(f"/dev/infiniband/{uverbs}")
    try:
        verdict = run_in_guest(
            guest,
            """
            async def main():
                async with KernelHost() as host:
                    r = await host.apply(DeleteRxe("rxe rxerc", "planned while free",
                                                   name="rxerc", netdev="labrc0"))
                    return {"outcome": r.outcome.value, "note": r.note}
            """,
        )
        assert verdict["outcome"] == "stale", verdict
        assert f"pid {pid} " in verdict["note"], verdict
        assert any(link["ifname"] == "rxerc" for link in guest.rdma_links())
    finally:
        guest.stop_unit(unit)
        guest.run("ip link del labrc0")
