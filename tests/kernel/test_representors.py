"""VF representors in use (issue #59): an eSwitch mode change or a numvfs change destroys
them with the VFs' vports, and unloading the PF driver destroys them too. On fake trees:
what uses one (a master such as an OVS datapath or a bridge, an rxe link on it), where
they are found (phys_port_name pfNvfM), the observation, the re-check right before a
mode change and the guard. The same on a real kernel's netdevsim representors:
tests/lab/test_eswitch_lab.py."""

from __future__ import annotations

from pathlib import Path

from rdmad.guard import decide
from rdmad.kernel.netlink.devlink import PfSeen
from rdmad.kernel.sysfs import Sysfs
from rdmad.kernel.usage.holders import representor_usage
from rdmad.model import FREE, EswitchObserved, RdmaLinkObserved, SetEswitch, Use
from tests.kernel.test_eswitch_host import FakeDevlink
from tests.kernel.test_host import make_host
from tests.support.fakesysfs import FakeSysfs

PF = "0000:af:00.0"
VFS = ("0000:af:00.2", "0000:af:00.3")
REPS = ("eth_rep0", "eth_rep1")
SWITCHDEV = EswitchObserved("switchdev", "none", "basic")


def switchdev_node(root: Path) -> FakeSysfs:
    """A PF in switchdev mode: two free VFs (no driver), their representors and the
    uplink under the PF's net/."""
    fs = FakeSysfs(root)
    fs.pf(PF, "mlx5_core", totalvfs=8, numvfs=2)
    fs.driver_module("mlx5_core", "mlx5_core")
    for i, vf in enumerate(VFS):
        fs.vf(PF, i, vf, None, iommu_group=80 + i)
    fs.netdev("enp175s0f0np0", PF, "b8:ce:f6:00:00:01", phys_port_name="p0")
    for i, rep in enumerate(REPS):
        fs.netdev(rep, PF, f"02:00:00:00:0e:0{i}", phys_port_name=f"pf0vf{i}")
    fs.netdev("br0", None, "02:00:00:00:0b:00")
    return fs


def enslave(fs: FakeSysfs, netdev: str, master: str) -> None:
    fs.link(f"sys/class/net/{netdev}/master", f"../{master}")


def rxe_on(fs: FakeSysfs, netdev: str) -> RdmaLinkObserved:
    ifindex = int((fs.root / f"sys/class/net/{netdev}/ifindex").read_text())
    return RdmaLinkObserved(name="rxe_rep", driver="rxe", netdev=netdev, netdev_ifindex=ifindex)


def test_representors_are_found_by_their_port_name(tmp_path: Path) -> None:
    switchdev_node(tmp_path)
    assert Sysfs(tmp_path).vf_representors(PF) == {0: REPS[0], 1: REPS[1]}


def test_what_uses_a_representor(tmp_path: Path) -> None:
    fs = switchdev_node(tmp_path)
    sysfs = Sysfs(tmp_path)
    assert representor_usage(sysfs, REPS[0]) is FREE
    enslave(fs, REPS[0], "br0")
    usage = representor_usage(sysfs, REPS[0])
    assert usage.state is Use.IN_USE
    assert usage.holders == (f"representor {REPS[0]} is a port of br0",)
    link = rxe_on(fs, REPS[1])
    usage = representor_usage(sysfs, REPS[1], [link])
    assert usage.holders == (f"representor {REPS[1]} carries rxe link rxe_rep",)
    gone = representor_usage(sysfs, "eth_rep9")
    assert gone.state is Use.UNKNOWN and "not in this network namespace" in gone.describe()


async def test_observe_gives_each_vf_its_representors_users(tmp_path: Path) -> None:
    fs = switchdev_node(tmp_path)
    enslave(fs, REPS[1], "br0")
    devlink = FakeDevlink({PF: PfSeen(SWITCHDEV, dict(enumerate(REPS)))})
    host = make_host(tmp_path, devlink=devlink)
    observed = await host.observe()
    pf = next(p for p in observed.pfs if p.pci == PF)
    vf0, vf1 = pf.vfs
    assert (vf0.representor, vf0.representor_usage, vf0.vport_busy) == (REPS[0], FREE, False)
    assert vf1.representor == REPS[1] and vf1.vport_busy
    assert vf1.vport_holders() == f"representor {REPS[1]} is a port of br0"


async def test_a_mode_change_under_a_representor_taken_since_the_plan_is_stale(
    tmp_path: Path,
) -> None:
    fs = switchdev_node(tmp_path)
    devlink = FakeDevlink({})
    host = make_host(tmp_path, devlink=devlink)
    enslave(fs, REPS[0], "br0")  # OVS took the port after the plan was made
    action = SetEswitch("o", "r", pci=PF, changes=(("mode", "switchdev", "legacy"),))
    result = await host.apply(action)
    assert result.stale and f"representor {REPS[0]} is a port of br0" in result.note
    assert devlink.sent == []
    (tmp_path / f"sys/class/net/{REPS[0]}/master").unlink()  # let go
    result = await host.apply(action)
    assert not result.stale and devlink.sent == [(PF, {"mode": "legacy"})]


def test_the_guard_refuses_an_unload_under_a_representor_in_use(tmp_path: Path) -> None:
    fs = switchdev_node(tmp_path)
    assert decide.decide(Sysfs(tmp_path), "mlx5_core", []).allowed
    enslave(fs, REPS[1], "br0")
    d = decide.decide(Sysfs(tmp_path), "mlx5_core", [])
    assert not d.allowed
    [held] = d.held
    assert held.what == f"the representor {REPS[1]} of VF 1 of PF {PF}"
    assert held.usage.holders == (f"representor {REPS[1]} is a port of br0",)
