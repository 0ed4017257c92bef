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


def test_vfio_bind_rechecks_after_the_module_load_before_the_unbind(guest: Any) -> None:
    """The bind loads vfio-pci (a modprobe that takes its time), then unbinds the VF.
    While the module loads, the VF's netdev is moved into a network namespace (a
    container takes it): the re-check right before the unbind drops the action."""
    verdict = run_in_guest(
        guest,
        """
        import subprocess

        SLOW = "/var/tmp/rdmad-lab-slow-modprobe"  # /run is noexec
        STARTED, GO = "/run/rdmad-lab-mp-started", "/run/rdmad-lab-mp-go"

        async def started(task, timeout=60.0):
            deadline = time.monotonic() + timeout
            while not os.path.exists(STARTED) and not task.done():
                if time.monotonic() > deadline:
                    raise TimeoutError(STARTED)
                await asyncio.sleep(0.05)

        async def main():
            pci = igb_pf()
            for f in (STARTED, GO):
                if os.path.exists(f):
                    os.unlink(f)
            with open(SLOW, "w") as fh:  # says it started, waits for the go (at most 60 s)
                fh.write(f"#!/bin/sh\\n: > {STARTED}\\nn=0\\n"
                         f"while [ ! -e {GO} ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n+1)); "
                         f"done\\nexec /sbin/modprobe \\"$@\\"\\n")
            os.chmod(SLOW, 0o755)
            try:
                async with KernelHost(modprobe_program=SLOW, modprobe_timeout=90) as host:
                    now = pf_of(await host.observe(), pci).numvfs
                    if now:
                        await host.apply(SetNumVfs("o", "lab", pci=pci, old=now, new=0))
                    await host.apply(SetNumVfs("o", "lab", pci=pci, old=0, new=1))
                    obs = await until(host, lambda o: any(
                        v.netdev and v.driver == "igbvf" for v in pf_of(o, pci).vfs),
                        "VF 0 on igbvf with its netdev")
                    vf = pf_of(obs, pci).vf(0)
                    subprocess.run(["modprobe", "-r", "vfio_pci"], check=False)
                    before = os.path.exists("/sys/module/vfio_pci")
                    task = asyncio.ensure_future(host.apply(BindVfDriver(
                        "o", "planned while free", vf_pci=vf.pci, old="igbvf",
                        new="vfio-pci", load_module=True)))
                    await started(task)
                    moved = subprocess.run(  # by its name now (udev may have renamed it)
                        f"udevadm settle; n=$(ls /sys/bus/pci/devices/{vf.pci}/net) && "
                        "ip netns add labmp && ip link set dev $n netns labmp && echo $n",
                        shell=True, capture_output=True, text=True)
                    open(GO, "w").close()
                    r = await asyncio.wait_for(task, 120)
                    return {"moved": [moved.returncode, moved.stderr], "before": before,
                            "vfio_loaded": os.path.exists("/sys/module/vfio_pci"),
                            "driver": os.path.basename(
                                os.readlink(f"/sys/bus/pci/devices/{vf.pci}/driver")),
                            "vf": vf.pci, "netdev": moved.stdout.strip(),
                            "outcome": r.outcome.value, "note": r.note,
                            "writes": [[w.target, w.ok] for w in r.writes]}
            finally:
                subprocess.run("ip netns del labmp", shell=True, check=False)
                with open(f"/sys/bus/pci/devices/{pci}/sriov_numvfs", "w") as fh:
                    fh.write("0")
        """,
    )
    assert verdict["moved"][0] == 0, verdict
    assert not verdict["before"] and verdict["vfio_loaded"], verdict  # the modprobe ran
    assert verdict["outcome"] == "stale", verdict
    assert f"netdev {verdict['netdev']} is in network namespace 'labmp'" in verdict["note"]
    assert verdict["driver"] == "igbvf"  # never unbound
    assert verdict["writes"] == [  # what ran before the re-check; not the unbind, not the probe
        ["module vfio-pci", True],
        [f"{verdict['vf']} driver_override", True],
    ]
