"""One observation asks the kernel each question once: the PCI devices are walked once,
and /proc/modules, /sys/module, the module switches and the kernel's release are read
once although three readers ask them (the loaded modules, the peer-memory facts,
rdma_rxe's availability). The pause file is read once too (tests/kernel/test_host.py:
whether to open an RDMA netlink socket and the snapshot's pause are one read)."""

from __future__ import annotations

from pathlib import Path

from rdmad.kernel.apply.observe import observe
from rdmad.kernel.sysfs import OnceReads, Sysfs
from rdmad.model import Desired
from rdmad.model.validation import validate
from rdmad.reconcile import observe_scope
from tests.support.countingsysfs import CountingSysfs
from tests.support.fakesysfs import gpu_node, mlx5_node


def test_a_gpu_node_with_everything_declared_is_asked_once(tmp_path: Path) -> None:
    gpu_node(tmp_path)
    fs = CountingSysfs(tmp_path)
    desired = validate(
        Desired,
        {"peermem": {"mode": "require"}, "rxe": [{"name": "rxe0", "netdev": {"name": "eth0"}}]},
    )
    seen = observe(fs, scope=observe_scope(desired))
    assert seen.modules.peermem.probed  # the costly facts were read...
    assert ("read", "proc/modules") in fs.asked and ("read_bytes", "proc/kallsyms") in fs.asked
    assert fs.twice() == {}  # ...and nothing twice


def test_an_sriov_node_walks_its_pci_devices_once(tmp_path: Path) -> None:
    mlx5_node(tmp_path)
    fs = CountingSysfs(tmp_path)
    seen = observe(fs, scope=observe_scope(Desired()))
    assert seen.pfs  # the PF and its VFs were found, with one listing
    assert fs.asked[("listdir", "sys/bus/pci/devices")] == 1
    assert [k for k in fs.twice() if k[1].startswith("sys/bus/pci")] == []


def test_once_reads_keep_a_trees_failures_and_hand_out_copies(tmp_path: Path) -> None:
    class Failing(Sysfs):
        def read(self, rel: str) -> str | None:
            return None if rel == "proc/modules" else super().read(rel)

    gpu_node(tmp_path)
    once = OnceReads(Failing(tmp_path))
    assert once.read("proc/modules") is None  # the tree's own failure, not a fresh read
    assert once.read("proc/sys/kernel/osrelease")
    listing = once.listdir("sys/module")
    listing.append("not-a-module")
    assert "not-a-module" not in once.listdir("sys/module")
