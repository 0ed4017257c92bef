"""SR-IOV restore on fake sysfs trees: netdevsim PFs, InfiniBand VF GUIDs/policy, snapshot.

No emulated InfiniBand device exists (not even in the QEMU lab), so the IB VF
path -- GUID and policy writes under /sys/class/infiniband/DEV/device/sriov/N/,
then unbind + re-probe of the VF so they take effect, only while it is free --
is proven here on the fake mlx5 tree, observe -> plan -> apply -> observe.
netdevsim PFs are not PCI functions: they are found under /sys/bus/netdevsim.
"""

from __future__ import annotations

from pathlib import Path

from rdmad import config
from rdmad.kernel.apply.host import KernelHost
from rdmad.kernel.apply.observe import observe
from rdmad.kernel.apply.results import Outcome
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Blocked, Desired, InUseDrift, PlanState, SetIbVf, SetNumVfs, Waiting
from rdmad.reconcile import plan
from rdmad.snapshot import snapshot
from rdmad.tomlcompat import tomllib
from tests.kernel.test_host import KernelishSysfs
from tests.support.fakesysfs import DEV, MLX5_PF, MLX5_VFS, QEMU_PID, FakeSysfs, mlx5_node

NODE_GUID = "00:11:22:33:44:55:66:77"
PORT_GUID = "00:11:22:33:44:55:66:78"


def declare(text: str) -> Desired:
    desired, errors = config.parse([("t.toml", tomllib.loads(text))])
    assert desired is not None, errors
    return desired


def kernel_host(root: Path) -> KernelHost:
    host = KernelHost(root)
    host.sysfs = KernelishSysfs(root)
    return host


# --- InfiniBand VF GUIDs and policy ---------------------------------------------------------

IB_CONFIG = f"""
[[sriov]]
pf = {{ pci = "{MLX5_PF}" }}
numvfs = 4
[[sriov.vf]]
index = 0
node_guid = "{NODE_GUID}"
port_guid = "{PORT_GUID}"
policy = "Up"
[[sriov.vf]]
index = 1
node_guid = "00:11:22:33:44:55:66:01"
policy = "Down"
"""


async def test_ib_guids_restored_and_rebound_only_when_free(tmp_path: Path) -> None:
    mlx5_node(tmp_path)  # VF1 is on vfio-pci with /dev/vfio/61 held by QEMU (pid 4242)
    desired = declare(IB_CONFIG)
    host = kernel_host(tmp_path)
    actions = plan(desired, await host.observe(), PlanState())

    ib = [a for a in actions if isinstance(a, SetIbVf)]
    assert [(a.vf, a.rebind) for a in ib] == [(0, True)]
    # VF 1 is in use: its GUID waits (a rebind would pull it from the guest) and its
    # policy is reported, not written ("Down" would take the guest's port down); both
    # reasons name the holder.
    (blocked,) = [a for a in actions if isinstance(a, Blocked)]
    assert f"pid {QEMU_PID} (qemu-system-x86) holds /dev/vfio/61" in blocked.reason
    assert "VF 1" in blocked.reason
    (drift,) = [a for a in actions if isinstance(a, InUseDrift)]
    assert (drift.vf, drift.attr) == (1, "policy")
    assert f"pid {QEMU_PID} (qemu-system-x86) holds /dev/vfio/61" in drift.reason

    for action in ib:
        result = await host.apply(action)
        assert result.outcome is Outcome.APPLIED, result.describe()
    sriov = tmp_path / DEV / MLX5_PF / "sriov"
    assert (sriov / "0/node").read_text() == NODE_GUID
    assert (sriov / "0/port").read_text() == PORT_GUID
    assert (sriov / "0/policy").read_text() == "Up"
    # VF 1 untouched.
    assert (sriov / "1/policy").read_text().strip() == "Follow"
    assert (sriov / "1/node").read_text().strip() == "00:00:00:00:00:00:00:00"
    # VF 0 was unbound and probed again (that is what makes new GUIDs take effect)...
    rebinds = [r for r in host.records if r.target == f"{MLX5_VFS[0]} driver"]
    assert [(r.old, r.new) for r in rebinds] == [("mlx5_core", None), (None, "mlx5_core")]
    # ...VF 1 never was.
    assert not [r for r in host.records if r.target == f"{MLX5_VFS[1]} driver"]

    again = plan(desired, await host.observe(), PlanState())
    assert [type(a) for a in again] == [Blocked, InUseDrift]  # only VF 1, still held

    # The holder goes away: the GUID and the policy are applied and VF 1 rebound.
    for fd in (tmp_path / f"proc/{QEMU_PID}/fd").iterdir():
        fd.unlink()
    final = plan(desired, await host.observe(), PlanState())
    (set_vf1,) = final
    assert isinstance(set_vf1, SetIbVf) and set_vf1.vf == 1 and set_vf1.rebind
    assert [c.attr for c in set_vf1.changes] == ["node_guid", "policy"]


async def test_ib_attributes_on_a_pf_without_ib_controls_are_blocked(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.pf("0000:5e:00.0", "igb", totalvfs=7, numvfs=1)
    fs.vf("0000:5e:00.0", 0, "0000:5e:10.0", None, iommu_group=5)
    desired = declare(
        '[[sriov]]\npf = { pci = "0000:5e:00.0" }\nnumvfs = 1\n'
        f'[[sriov.vf]]\nindex = 0\nnode_guid = "{NODE_GUID}"\n'
    )
    actions = plan(desired, observe(Sysfs(tmp_path)), PlanState())
    assert len(actions) == 1 and isinstance(actions[0], Blocked)
    assert "need an InfiniBand PF" in actions[0].reason


# --- netdevsim PFs ---------------------------------------------------------------------------


def netdevsim(root: Path, dev: int, numvfs: int, netdev: str, max_vfs: int | None = None) -> None:
    """/sys/bus/netdevsim/devices/netdevsimN as kernel 6.1 lays it out."""
    fs = FakeSysfs(root)
    base = f"sys/devices/netdevsim{dev}"
    fs.link(f"sys/bus/netdevsim/devices/netdevsim{dev}", f"../../../devices/netdevsim{dev}")
    fs.write(f"{base}/sriov_numvfs", str(numvfs))
    fs.link(f"{base}/driver", "../../bus/netdevsim/drivers/netdevsim")
    fs.write(f"{base}/net/{netdev}/address", "5e:2f:00:00:00:01")
    fs.write(f"{base}/net/{netdev}/ifindex", "12")
    fs.write(f"{base}/net/{netdev}/flags", "0x1003")
    fs.link(f"sys/class/net/{netdev}", f"../../devices/netdevsim{dev}/net/{netdev}")
    if max_vfs is not None:
        fs.write(f"sys/kernel/debug/netdevsim/netdevsim{dev}/max_vfs", str(max_vfs))


def test_netdevsim_pf_is_observed_and_matched_by_name(tmp_path: Path) -> None:
    netdevsim(tmp_path, 10, numvfs=2, netdev="eni10np1", max_vfs=64)
    netdevsim(tmp_path, 11, numvfs=0, netdev="eni11np1")
    observed = observe(Sysfs(tmp_path))
    pfs = {p.pci: p for p in observed.pfs}
    assert set(pfs) == {"netdevsim10", "netdevsim11"}
    p = pfs["netdevsim10"]
    assert (p.netdev, p.numvfs, p.totalvfs, p.driver) == ("eni10np1", 2, 64, "netdevsim")
    assert [(v.index, v.pci, v.usage.busy) for v in p.vfs] == [
        (0, "netdevsim10/vf0", False),
        (1, "netdevsim10/vf1", False),
    ]
    assert pfs["netdevsim11"].totalvfs == 4  # no debugfs limit: netdevsim's default

    desired = declare(
        '[[sriov]]\npf = { name = "eni10np1" }\nnumvfs = 4\n'
        '[[sriov]]\npf = { name = "eni11np1" }\nnumvfs = 8\n'
    )
    actions = plan(desired, observed, PlanState())
    assert [a.describe() for a in actions if isinstance(a, SetNumVfs)] == [
        "netdevsim10: sriov_numvfs 2 -> 0",
        "netdevsim10: sriov_numvfs 0 -> 4",
    ]
    (blocked,) = [a for a in actions if isinstance(a, Blocked)]
    assert blocked.reason == "numvfs 8 exceeds sriov_totalvfs 4 of netdevsim11"


async def test_netdevsim_numvfs_written_in_its_bus_directory(tmp_path: Path) -> None:
    netdevsim(tmp_path, 10, numvfs=0, netdev="eni10np1")
    host = KernelHost(tmp_path)
    result = await host.apply(SetNumVfs("o", "r", pci="netdevsim10", old=0, new=3))
    assert result.outcome is Outcome.APPLIED, result.describe()
    assert (tmp_path / "sys/devices/netdevsim10/sriov_numvfs").read_text() == "3"
    assert [(w.target, w.old, w.new) for w in result.writes] == [("netdevsim10 sriov_numvfs", 0, 3)]


def test_netdevsim_snapshot_declares_the_pf_by_name(tmp_path: Path) -> None:
    netdevsim(tmp_path, 10, numvfs=2, netdev="eni10np1")
    observed = observe(Sysfs(tmp_path))
    text = snapshot(observed)
    assert 'pf = { name = "eni10np1" }  # netdevsim10' in text
    actions = plan(declare(text), observed, PlanState())
    assert actions == []


def test_missing_pf_waits_and_names_it(tmp_path: Path) -> None:
    mlx5_node(tmp_path)
    desired = declare('[[sriov]]\npf = { pci = "0000:99:00.0" }\nnumvfs = 2\n')
    (action,) = plan(desired, observe(Sysfs(tmp_path)), PlanState())
    assert isinstance(action, Waiting)
    assert action.reason == "PF 0000:99:00.0 is not present (no SR-IOV capable device)"
