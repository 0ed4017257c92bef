"""KernelHost against the lab guest's real kernel: igb SR-IOV, VF settings, rxe, vfio usage.

Each test runs one script in the guest (rdmad installed into the guest venv by the
harness) that drives KernelHost and prints a JSON verdict; the host asserts on it.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

pytestmark = pytest.mark.lab

_PRELUDE = textwrap.dedent(
    """
    import asyncio, glob, json, os, time
    from rdmad.kernel.apply.host import KernelHost
    from rdmad.model import (AddRxe, BindVfDriver, DeleteRxe, SetNumVfs, SetVfSettings,
                             VfChange)

    def igb_pf():
        return sorted(os.path.basename(p) for p in glob.glob("/sys/bus/pci/drivers/igb/0000:*")
                      if os.path.exists(p + "/sriov_totalvfs"))[0]

    async def until(host, pred, what, timeout=60.0):
        deadline = time.monotonic() + timeout
        while True:
            obs = await host.observe()
            if pred(obs):
                return obs
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            await asyncio.sleep(0.1)

    def pf_of(obs, pci):
        return next(p for p in obs.pfs if p.pci == pci)

    def result_json(r):
        return {"outcome": r.outcome.value, "errors": [str(e) for e in r.errors],
                "errnos": [e.errno for e in r.errors],
                "writes": [[w.target, str(w.old), str(w.new), w.ok] for w in r.writes]}
    """
)


def run_in_guest(guest: Any, body: str, timeout: float = 300.0) -> dict[str, Any]:
    from harness import install_rdmad  # type: ignore[import-not-found]

    python = install_rdmad(guest)
    script = _PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(asyncio.run(main())))\n"
    result = guest.run([python, "-c", script], timeout=timeout)
    assert result.returncode == 0, f"guest script failed:\n{result.stdout}\n{result.stderr}"
    verdict: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return verdict


def test_numvfs_vf_settings_and_rxe_for_real(guest: Any) -> None:
    verdict = run_in_guest(
        guest,
        """
        async def main():
            pci = igb_pf()
            out = {}
            async with KernelHost() as host:
                obs = await host.observe()
                pf = pf_of(obs, pci)
                out["before"] = [pf.numvfs, pf.totalvfs, pf.netdev]
                r = await host.apply(SetNumVfs("o", "lab", pci=pci, old=pf.numvfs, new=0))
                r = await host.apply(SetNumVfs("o", "lab", pci=pci, old=0, new=2))
                out["numvfs"] = result_json(r)
                obs = await until(host, lambda o: len(pf_of(o, pci).vfs) == 2
                                  and all(v.settings for v in pf_of(o, pci).vfs), "2 VFs")
                pf = pf_of(obs, pci)
                out["vfs"] = [[v.index, v.pci, v.driver] for v in pf.vfs]
                changes = (VfChange(0, "mac", pf.vfs[0].settings.mac, "02:00:00:00:0a:01"),
                           VfChange(0, "vlan", 0, 42),
                           VfChange(0, "trust", False, True),
                           VfChange(0, "link_state", "auto", "enable"))
                r = await host.apply(SetVfSettings("o", "lab", pci=pci, pf_netdev=pf.netdev,
                                                   changes=changes))
                out["settings"] = result_json(r)
                s = pf_of(await host.observe(), pci).vf(0).settings
                out["vf0"] = [s.mac, s.vlan, s.trust]
                r = await host.apply(AddRxe("rxe rxelab0", "lab", name="rxelab0",
                                            netdev=pf.netdev))
                out["add"] = result_json(r)
                link = (await host.observe()).rdma_link("rxelab0")
                out["rxe"] = link and [link.driver, link.netdev]
                r = await host.apply(DeleteRxe("rxe rxelab0", "lab", name="rxelab0"))
                out["delete"] = result_json(r)
                out["after"] = (await host.observe()).rdma_link("rxelab0") is None
                out["records"] = len(host.records)
                out["rdma_netlink"] = obs.rdma_netlink
            return out
        """,
    )
    assert verdict["before"][1] == 7, verdict
    assert verdict["numvfs"]["outcome"] == "applied", verdict["numvfs"]
    assert [v[0] for v in verdict["vfs"]] == [0, 1] and all(v[2] == "igbvf" for v in verdict["vfs"])
    settings = verdict["settings"]
    assert settings["outcome"] == "partial", settings
    assert settings["errnos"] == [95] and "set vf 0 link_state" in settings["errors"][0]
    assert verdict["vf0"] == ["02:00:00:00:0a:01", 42, True]
    assert verdict["add"]["outcome"] == "applied", verdict["add"]
    assert verdict["rxe"][0] == "rxe" and verdict["rxe"][1] == verdict["before"][2]
    assert verdict["delete"]["outcome"] == "applied" and verdict["after"]
    assert verdict["rdma_netlink"] is True


def test_bind_vfio_and_usage_names_the_holder(guest: Any) -> None:
    bdf = run_in_guest(
        guest,
        """
        async def main():
            pci = igb_pf()
            async with KernelHost() as host:
                await host.apply(SetNumVfs("o", "lab", pci=pci, old=0, new=0))
                await host.apply(SetNumVfs("o", "lab", pci=pci, old=0, new=1))
                obs = await until(host, lambda o: len(pf_of(o, pci).vfs) == 1, "1 VF")
                vf = pf_of(obs, pci).vf(0)
                r = await host.apply(BindVfDriver("o", "lab", vf_pci=vf.pci, old=vf.driver,
                                                  new="vfio-pci", load_module=True))
                return {"vf": vf.pci, "bind": result_json(r)}
        """,
    )
    assert bdf["bind"]["outcome"] == "applied", bdf["bind"]
    vf = bdf["vf"]
    group = guest.check(f"basename $(readlink /sys/bus/pci/devices/{vf}/iommu_group)").strip()
    unit, pid = guest.hold_open(f"/dev/vfio/{group}")
    try:
        verdict = run_in_guest(
            guest,
            f"""
            async def main():
                async with KernelHost() as host:
                    obs = await host.observe()
                    vf = pf_of(obs, igb_pf()).vf(0)
                    return {{"driver": vf.driver, "state": vf.usage.state.value,
                             "holders": list(vf.usage.holders), "pci": vf.pci,
                             "want": {vf!r}}}
            """,
        )
    finally:
        guest.stop_unit(unit)
    assert verdict["driver"] == "vfio-pci" and verdict["pci"] == vf
    assert verdict["state"] == "in-use"
    assert any(f"pid {pid} " in h and f"/dev/vfio/{group}" in h for h in verdict["holders"]), (
        verdict
    )
