"""observe() reads other managers' SR-IOV files under the root, for every PF: a .link
file for the igb PF (matched by driver, by udev's ID_PATH), and a directory that cannot
be read (unknown, never "nothing there"); `rdmad plan --root` then holds the PF."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from rdmad import config
from rdmad.kernel.apply.observe import observe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Blocked, PlanState
from rdmad.reconcile import plan
from tests.support.failinject import FailAt
from tests.support.fakesysfs import IGB_PF, MLX5_PF, mlx5_node

LINK = "[Match]\n{match}\n\n[Link]\nSR-IOVVirtualFunctions=4\n"


def pfs(root: Path) -> dict[str, object]:
    return {pf.pci: pf.managers for pf in observe(Sysfs(root)).pfs}


@pytest.mark.parametrize("match", ["Driver=igb", "Path=pci-0000:5e:00.0", "OriginalName=enp94s0f*"])
def test_a_link_file_for_the_igb_pf(tmp_path: Path, match: str) -> None:
    fs = mlx5_node(tmp_path)
    fs.write("etc/systemd/network/10-igb.link", LINK.format(match=match))
    for name in ("enp94s0f0", *os.listdir(tmp_path / f"sys/bus/pci/devices/{MLX5_PF}/net")):
        fs.write(f"sys/class/net/{name}/name_assign_type", "1")  # the kernel's own name
        fs.write(f"sys/class/net/{name}/type", "1")
    seen = pfs(tmp_path)
    igb = seen[IGB_PF]
    assert igb is not None and [c.file for c in igb.claims] == ["/etc/systemd/network/10-igb.link"]
    mlx5 = seen[MLX5_PF]
    assert mlx5 is not None and not mlx5.contested


def test_udev_properties_are_read_for_path_and_property(tmp_path: Path) -> None:
    fs = mlx5_node(tmp_path)
    ifindex = (tmp_path / "sys/class/net/enp94s0f0/ifindex").read_text().strip()
    fs.write(f"run/udev/data/n{ifindex}", "I:1\nE:ID_PATH=pci-0000:00:1c.0-pci-0000:5e:00.0\n")
    fs.write("etc/systemd/network/10-igb.link", LINK.format(match="Path=*-pci-0000:5e:00.0"))
    igb = pfs(tmp_path)[IGB_PF]
    assert igb is not None and igb.claims[0].certain


def test_an_unreadable_directory_is_unknown_and_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mlx5_node(tmp_path)
    cfg = tmp_path / "rdmad.toml"
    cfg.write_text(f'[[sriov]]\npf = {{ pci = "{IGB_PF}" }}\nnumvfs = 2\n')
    FailAt(monkeypatch, tmp_path).fail("etc/NetworkManager/system-connections", errno.EACCES)
    igb = pfs(tmp_path)[IGB_PF]
    assert igb is not None and igb.claims == ()
    assert igb.unknown == ("cannot list /etc/NetworkManager/system-connections: Permission denied",)
    actions = plan(config.load(cfg).desired, observe(Sysfs(tmp_path)), PlanState())
    assert [type(a) for a in actions if a.obj.startswith("sriov")] == [Blocked]
