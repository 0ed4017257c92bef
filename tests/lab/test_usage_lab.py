"""Who holds a VF, on the lab's real 6.1 kernel (igb VFs).

* An rxe link on an igb VF's netdev whose uverbs device a process holds: observe()
  and vf_usage_now() report the VF in use naming the rxe link and the pid; with
  rdmad running as the service and the config lowering numvfs 2 -> 1, the status is
  blocked naming the holder, and after the daemon's next passes (counted in its own
  debug log) numvfs, the rxe link, the holder and the VF settings are all unchanged.
  Lowering numvfs there would hang the kernel (igbvf_remove waits forever for the
  netdev the rxe link holds), so this is the guard against a hung node.
* A VF netdev moved into a namespace made by the test (`ip netns add`, `ip link set
  DEV netns NS`) with a process living in it: observe() reports the VF in use naming
  the namespace and the process, and `rdmad plan` blocks lowering numvfs.
* A pod's VF as the SR-IOV CNI leaves it keeps its RDMA device in the host (mlx5,
  RDMA netns mode shared). An igb VF has no RDMA device of its own, and an rxe link
  on its netdev does not stay: moving the netdev out unregisters it (rxe drops its
  device on NETDEV_UNREGISTER, which a namespace move sends), shown here. So that
  shape is carried by the kernel layer's namespace test and the fake trees
  (tests/kernel/test_usage.py), and here the VF still reads in use by its namespace.

Kernel state is read back with iproute2 and sysfs, not with rdmad's own code.
"""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest
from harness import Guest, install_rdmad, log
from service import ctl_status, journal, reload, start
from service import status_text as status

pytestmark = [pytest.mark.lab, pytest.mark.timeout(900)]

_OBSERVE = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from rdmad.kernel.apply.oneshot import observe_host
    from rdmad.kernel.sysfs import Sysfs
    from rdmad.kernel.usage.holders import vf_usage_now

    obs = observe_host(Path("/"))
    pf = next(p for p in obs.pfs if p.pci == sys.argv[1])
    out = {}
    for v in pf.vfs:
        now = vf_usage_now(Sysfs("/"), v.pci, obs.rdma_links)
        out[str(v.index)] = {
            "netdev": v.netdev,
            "observed": [v.usage.state.value, list(v.usage.holders)],
            "now": [now.state.value, list(now.holders)],
        }
    print(json.dumps(out))
    """
)


def observe_vfs(g: Guest, pf: str) -> dict[str, Any]:
    """VF index -> netdev, usage from observe() and from vf_usage_now(), in the guest."""
    python = install_rdmad(g)
    res = g.run([python, "-c", _OBSERVE, pf], timeout=300)
    assert res.ok, res.describe()
    return dict(json.loads(res.out.strip().splitlines()[-1]))


def vf_macs(g: Guest, pf_netdev: str) -> dict[int, str]:
    return {int(e["vf"]): e["address"] for e in g.vf_info(pf_netdev)}


def config(pf: str, numvfs: int, macs: dict[int, str]) -> str:
    lines = [
        "[daemon]",
        'drift_interval = "2s"',
        'log_level = "debug"',  # one reconcile.pass line per pass: the passes are counted
        "",
        "[[sriov]]",
        f'pf = {{ pci = "{pf}" }}',
        f"numvfs = {numvfs}",
    ]
    for index, mac in sorted(macs.items()):
        lines += ["", "[[sriov.vf]]", f"index = {index}", f'mac = "{mac}"']
    return "\n".join(lines) + "\n"


def passes(g: Guest) -> int:
    """Reconcile passes of the running rdmad, from its own log."""
    return journal(g).count("reconcile.pass")


@pytest.fixture
def rdmad_guest(guest: Guest) -> Guest:
    assert guest.install_rdmad().unit_installed
    return guest


def test_held_rxe_link_on_a_vf_blocks_lowering_numvfs_and_nothing_is_touched(
    rdmad_guest: Guest,
) -> None:
    g = rdmad_guest
    pf = g.igb_pf()
    pf_netdev = g.pci_netdevs(pf)[0]
    macs = {0: "02:00:00:00:0b:00", 1: "02:00:00:00:0b:01"}
    start(g, config(pf, 2, macs))
    g.wait_until(lambda: vf_macs(g, pf_netdev) == macs, timeout=120, what="2 VFs with MACs")
    vf0_pci = g.vf_bdfs(pf)[0]
    vf0 = g.wait_vf_netdevs(pf, 2)[vf0_pci]
    g.check(f"rdma link add rxe0 type rxe netdev {vf0}", timeout=120)
    g.wait_for("test -e /sys/class/infiniband/rxe0", timeout=30)
    uverbs = g.uverbs_node("rxe0")
    unit, pid = g.hold_open(uverbs)
    holder = f"pid {pid} (sleep) holds {uverbs}"
    try:
        # observe() and the apply-time re-check both see it.
        vfs = observe_vfs(g, pf)
        assert vfs["0"]["netdev"] == vf0
        for view in ("observed", "now"):
            state, holders = vfs["0"][view]
            assert state == "in-use", vfs
            assert holders == [f"{vf0} carries rxe link rxe0", holder], vfs
        assert vfs["1"]["observed"][0] == "free", vfs

        settings_before = g.vf_info(pf_netdev)
        reload(g, config(pf, 1, {0: macs[0]}))
        g.wait_for(f"systemctl show -p StatusText --value rdmad | grep -q 'pid {pid} '", timeout=60)
        text = status(g)
        assert "would destroy VFs in use" in text, text
        assert f"VF 0 ({vf0_pci})" in text and "carries rxe link rxe0" in text, text
        seen = passes(g)
        g.wait_until(lambda: passes(g) >= seen + 3, timeout=90, what="3 more rdmad passes")

        # Untouched in every way.
        assert g.numvfs(pf) == 2
        assert [(r["ifname"], r.get("netdev")) for r in g.rdma_links()] == [("rxe0", vf0)]
        assert g.unit_pid(unit) == pid and g.pids_holding(uverbs) == [pid]
        assert g.vf_info(pf_netdev) == settings_before
        assert g.pci_netdevs(vf0_pci) == [vf0]
        assert "would destroy VFs in use" in status(g)

        # The operator's view: not converged (exit 1), the VF blocked, naming its holder.
        table, doc = ctl_status(g)
        assert table.rc == 1, table.describe()
        assert f"pid {pid} (sleep)" in table.out and "blocked" in table.out, table.out
        assert doc["converged"] is False
        obj = next(o for o in doc["objects"] if o["obj"] == f"sriov pci={pf}")
        assert obj["state"] == "blocked", obj
        assert obj["attributes"][0]["name"] == "numvfs", obj
        assert (obj["attributes"][0]["desired"], obj["attributes"][0]["observed"]) == (1, 2)
        vf = next(v for v in obj["vfs"] if v["vf"] == 0)
        assert vf["usage"] == "in-use" and holder in vf["holders"], vf
        applied = [ln for ln in journal(g).splitlines() if "sriov_numvfs" in ln and "->" in ln]
        assert not [ln for ln in applied if "2 -> 0" in ln], applied
    except Exception:
        log(f"status: {status(g)}\n{journal(g)[-4000:]}")
        raise


NETNS = "labtenant"


def living_in_netns(g: Guest, name: str) -> tuple[str, int]:
    """A process living in NETNS (as a pod's does): its unit and pid, once it is there."""
    unit = g.start_unit(name, f"exec ip netns exec {NETNS} sleep 600")
    pid = g.unit_pid(unit)
    g.wait_for(f'[ "$(cat /proc/{pid}/comm)" = sleep ]', timeout=30)
    return unit, pid


def two_vfs(g: Guest) -> tuple[str, str]:
    """The igb PF with two VFs: (the PF, VF 1's netdev once udev named it)."""
    pf = g.igb_pf()
    assert g.set_numvfs(pf, 2).ok
    return pf, g.wait_vf_netdevs(pf, 2)[g.vf_bdfs(pf)[1]]


def test_vf_netdev_in_another_namespace_is_in_use_naming_it(guest: Guest) -> None:
    g = guest
    pf, vf1 = two_vfs(g)
    unit = None
    try:
        g.check(f"ip netns add {NETNS} && ip link set {vf1} netns {NETNS}")
        g.wait_for(f"ip -n {NETNS} link show {vf1} >/dev/null 2>&1", timeout=30)
        unit, pid = living_in_netns(g, "lab-tenant")

        vfs = observe_vfs(g, pf)
        want = f"netdev {vf1} is in network namespace {NETNS!r} (pid {pid} (sleep))"
        for view in ("observed", "now"):
            assert vfs["1"][view] == ["in-use", [want]], vfs
        assert vfs["1"]["netdev"] is None and vfs["0"]["observed"][0] == "free", vfs

        g.check(
            "mkdir -p /tmp/usage && cat > /tmp/usage/rdmad.toml", stdin=config(pf, 1, {}).encode()
        )
        res = g.run("rdmad plan --config /tmp/usage/rdmad.toml", timeout=300)
        assert "would destroy VFs in use" in res.out and want in res.out, res.describe()
        assert res.rc == 1, res.describe()  # a plan that stays blocked
        assert g.numvfs(pf) == 2
        assert g.run(f"ip -n {NETNS} link show {vf1}").ok  # still where its owner put it
    finally:
        if unit is not None:
            g.stop_unit(unit)
        g.run(f"ip netns delete {NETNS}; rm -rf /tmp/usage", timeout=60)


def test_an_rxe_link_does_not_follow_its_netdev_into_a_namespace(guest: Guest) -> None:
    g = guest
    pf, vf1 = two_vfs(g)
    unit = None
    try:
        g.check(f"modprobe rdma_rxe && rdma link add labpod type rxe netdev {vf1}")
        g.wait_for("rdma link show labpod/1 >/dev/null 2>&1", timeout=30)
        g.check(f"ip netns add {NETNS} && ip link set {vf1} netns {NETNS}")
        g.wait_for("! rdma link show labpod/1 >/dev/null 2>&1", timeout=60)
        unit, pid = living_in_netns(g, "lab-pod")
        vfs = observe_vfs(g, pf)
        want = f"netdev {vf1} is in network namespace {NETNS!r} (pid {pid} (sleep))"
        assert vfs["1"]["observed"] == ["in-use", [want]], vfs
    finally:
        if unit is not None:
            g.stop_unit(unit)
        g.run(f"ip netns delete {NETNS}", timeout=60)
