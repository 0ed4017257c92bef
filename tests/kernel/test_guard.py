"""The driver guard on fake trees: the decision, its words, the command line, the pause.

The same decisions on the real 6.1 kernel (igb VFs held through vfio, a netns, an
rxe link with a verbs user; `modprobe -r` through the hook) are in
tests/lab/test_guard_lab.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rdmad.guard import cli, decide
from rdmad.guard.decide import TargetError
from rdmad.kernel.guardhook import HOOK_FILE, guard_command, observe_hook, render, write_hook
from rdmad.kernel.pause import PAUSE_FILE, clear_pause, read_pause, write_pause
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import RdmaLinkObserved, Usage, Use
from tests.support.fakesysfs import IGB_PF, MLX5_PF, MLX5_VFS, QEMU_PID, FakeSysfs, mlx5_node

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def node(tmp_path: Path) -> FakeSysfs:
    fs = mlx5_node(tmp_path)
    fs.driver_module("mlx5_core", "mlx5_core")
    fs.driver_module("igb", "igb")
    return fs


def test_module_with_a_vf_held_through_vfio_is_refused_naming_pid_and_advice(
    node: FakeSysfs,
) -> None:
    d = decide.decide(Sysfs(node.root), "mlx5_core", [])
    assert not d.allowed
    assert d.modules == ("mlx5_core",)
    [held] = d.held
    assert held.what == f"VF 1 ({MLX5_VFS[1]}) of PF {MLX5_PF}"
    assert held.usage.holders == (f"pid {QEMU_PID} (qemu-system-x86) holds /dev/vfio/61",)
    text = d.explain()
    assert f"stop pid {QEMU_PID} (qemu-system-x86)" in text
    assert "RDMAD_GUARD_FORCE=1" in text


def test_a_roce_vf_whose_netdev_is_not_here_blocks_the_unload(tmp_path: Path) -> None:
    # A pod's VF as the SR-IOV CNI leaves it: the netdev moved out, the RDMA device
    # (RDMA netns mode shared) still here. On a tree nobody can look in the pod's
    # namespace, so the VF is unknown: refused, like a VF held by a known process.
    fs = FakeSysfs(tmp_path)
    pf, vf = "0000:af:00.0", "0000:af:00.2"
    fs.pf(pf, "mlx5_core", totalvfs=8, numvfs=1)
    fs.vf(pf, 0, vf, "mlx5_core", iommu_group=90)
    fs.ib_device("mlx5_5", vf, "00:00:00:00:00:00:00:05", link_layer="Ethernet")
    fs.driver_module("mlx5_core", "mlx5_core")
    d = decide.decide(Sysfs(tmp_path), "mlx5_core", [])
    assert not d.allowed
    [held] = d.held
    assert held.what == f"VF 0 ({vf}) of PF {pf}"
    assert "its netdev is not in this network namespace" in held.usage.describe()


def test_pci_targets_a_pf_its_vfs_or_one_vf(node: FakeSysfs) -> None:
    sysfs = Sysfs(node.root)
    assert not decide.decide(sysfs, MLX5_PF, []).allowed
    assert not decide.decide(sysfs, MLX5_PF.removeprefix("0000:"), []).allowed  # short form
    free_vf = decide.decide(sysfs, MLX5_VFS[0], [])
    assert free_vf.allowed, free_vf.explain()
    igb = decide.decide(sysfs, IGB_PF, [])
    assert igb.allowed and igb.checked == (f"{IGB_PF}: no VFs",)


def test_targets_that_name_nothing_are_usage_errors(node: FakeSysfs) -> None:
    sysfs = Sysfs(node.root)
    with pytest.raises(TargetError, match="no PCI device at that address"):
        decide.decide(sysfs, "0000:99:00.0", [])
    with pytest.raises(TargetError, match="neither a module"):
        decide.decide(sysfs, "igb; touch /tmp/x", [])
    gone = decide.decide(sysfs, "ixgbe", [])
    assert gone.allowed and gone.checked == ("no module or PCI driver ixgbe is loaded",)


def test_libvirt_namespace_and_rdma_link_holders_each_get_advice(node: FakeSysfs) -> None:
    node.libvirt_domain(
        "vm7",
        "<hostdev mode='subsystem' type='pci'><source><address domain='0x0000' bus='0x3b' "
        "slot='0x00' function='0x4'/></source></hostdev>",
    )
    node.netdev("enp59s0v0", MLX5_VFS[0], "02:00:00:00:00:10")
    link = RdmaLinkObserved("rxe9", "rxe", "enp59s0v0", usage=Usage(Use.FREE))
    d = decide.decide(Sysfs(node.root), "mlx5_core", [link])
    advice = "\n".join(a for h in d.held for a in h.advice())
    assert "shut down VM vm7 (virsh shutdown vm7)" in advice
    assert "delete RDMA link rxe9 on enp59s0v0 (rdma link delete rxe9)" in advice
    assert decide.advice_for("netdev eth1 is in network namespace 'blue' (pid 9 (sh))") == (
        "move the netdev back (ip -n NS link set eth1 netns 1) or stop what lives in "
        "namespace 'blue' (pid 9 (sh))"
    )
    assert decide.advice_for("kernel user rpcrdma: 2 QPs").startswith("stop the kernel user")


def test_rdma_rxe_is_refused_while_a_link_has_users(node: FakeSysfs) -> None:
    sysfs = Sysfs(node.root)
    node.ib_device("rxe0", None, "0", netdev="eth0", link_layer="Ethernet")
    used = RdmaLinkObserved(
        "rxe0", "rxe", "eth0", usage=Usage(Use.IN_USE, ("pid 5 (ib_send_bw): 1 QP",))
    )
    refused = decide.decide(sysfs, "rdma_rxe", [used])
    assert not refused.allowed and refused.held[0].what == "rxe link rxe0 on eth0"
    idle = RdmaLinkObserved("rxe0", "rxe", "eth0")
    assert decide.decide(sysfs, "rdma_rxe", [idle]).allowed
    node.process(6, "rping", node.uverbs(0, "rxe0"))  # a verbs user holds it open
    assert not decide.decide(sysfs, "rdma_rxe", [idle]).allowed


def test_cli_check_exit_codes_json_and_force(
    node: FakeSysfs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(node.root)
    monkeypatch.delenv("RDMAD_GUARD_FORCE", raising=False)
    assert cli.main(["check", "mlx5_core", "--json"], root=root) == cli.EXIT_REFUSED
    doc = json.loads(capsys.readouterr().out)
    assert doc["allowed"] is False and doc["forced"] is False
    assert doc["decisions"][0]["held"][0]["holders"] == [
        f"pid {QEMU_PID} (qemu-system-x86) holds /dev/vfio/61"
    ]
    assert cli.main(["check", "mlx5_core", "--force"], root=root) == cli.EXIT_ALLOWED
    assert "forced" in capsys.readouterr().err
    monkeypatch.setenv("RDMAD_GUARD_FORCE", "1")
    assert cli.main(["check", "mlx5_core"], root=root) == cli.EXIT_ALLOWED
    monkeypatch.setenv("RDMAD_GUARD_FORCE", "0")
    assert cli.main(["check", "mlx5_core"], root=root) == cli.EXIT_REFUSED
    assert cli.main(["check", "0000:99:00.0"], root=root) == cli.EXIT_USAGE
    assert cli.main(["check", "igb"], root=root) == cli.EXIT_ALLOWED
    assert "nothing in use" in capsys.readouterr().out


def test_an_internal_error_or_the_deadline_refuses_unless_forced(
    node: FakeSysfs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(node.root)
    monkeypatch.delenv("RDMAD_GUARD_FORCE", raising=False)

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "decide", broken)
    assert cli.main(["check", "igb"], root=root) == cli.EXIT_REFUSED
    assert "internal error: RuntimeError: boom" in capsys.readouterr().err
    assert cli.main(["check", "igb", "--force"], root=root) == cli.EXIT_ALLOWED

    def hangs(*_a: object, **_k: object) -> None:
        time.sleep(30)  # interrupted by the guard's own deadline, never waited out

    monkeypatch.setattr(cli, "decide", hangs)
    monkeypatch.setenv("RDMAD_GUARD_DEADLINE", "0.2")
    assert cli.main(["check", "igb"], root=root) == cli.EXIT_REFUSED
    assert "no decision within 0.2 s" in capsys.readouterr().err


def test_with_json_every_outcome_is_a_document_on_stdout(
    node: FakeSysfs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that asks for --json reads stdout: a bad target and an undecided check
    printed only to stderr before, and left it nothing to parse."""
    root = str(node.root)
    monkeypatch.delenv("RDMAD_GUARD_FORCE", raising=False)
    assert cli.main(["check", "0000:zz:00.0", "--json"], root=root) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    message = "rdmad-guard: '0000:zz:00.0' is neither a module or driver name nor a PCI address"
    assert json.loads(out) == {"error": {"code": "usage", "exit": 2, "message": message}}
    assert message in err

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(cli, "decide", broken)
    for argv, allowed, code in [
        ([], False, cli.EXIT_REFUSED),
        (["--force"], True, cli.EXIT_ALLOWED),
    ]:
        assert cli.main(["check", "igb", "--json", *argv], root=root) == code
        out, err = capsys.readouterr()
        assert json.loads(out) == {
            "allowed": allowed,
            "forced": allowed,
            "decisions": [],
            "undecided": "internal error: RuntimeError: boom",
        }
        assert "the guard could not decide" in err


def test_hook_allowed_pauses_rdmad_and_refused_does_not(node: FakeSysfs) -> None:
    sysfs = Sysfs(node.root)
    node.write("run/rdmad/.keep", "")
    assert cli.main(["hook", "mlx5_core"], root=str(node.root)) == cli.EXIT_REFUSED
    assert read_pause(sysfs, time.time()) is None
    assert cli.main(["hook", "igb"], root=str(node.root)) == cli.EXIT_ALLOWED
    pause = read_pause(sysfs, time.time())
    assert pause is not None
    assert pause.modules == ("ib_core", "igb")
    assert pause.by.startswith("`modprobe -r igb` (")


def test_stack_stop_checks_every_module_the_hook_guards(node: FakeSysfs) -> None:
    sysfs = Sysfs(node.root)
    node.write(HOOK_FILE, render(["igb"], guard_command()))
    assert cli.main(["stack-stop", "--by", "openibd.service"], root=str(node.root)) == 0
    pause = read_pause(sysfs, time.time())
    assert pause is not None and pause.by.startswith("openibd.service (")
    clear_pause(sysfs)
    node.write(HOOK_FILE, render(["igb", "mlx5_core"], guard_command()))
    assert cli.main(["stack-stop"], root=str(node.root)) == cli.EXIT_REFUSED
    assert read_pause(sysfs, time.time()) is None


def test_pause_ends_at_its_deadline_or_when_a_module_is_loaded_again(node: FakeSysfs) -> None:
    sysfs = Sysfs(node.root)
    now = 1_000_000.0
    write_pause(sysfs, by="t", reason="r", seconds=60, modules=["igb", "nvidia"], now=now)
    assert oct(os.stat(sysfs.path(PAUSE_FILE)).st_mode & 0o777) == "0o644"
    assert read_pause(sysfs, now + 59) is not None
    assert read_pause(sysfs, now + 60) is None  # ran out
    # igb unloaded: still paused; loaded again (a new /sys/module/igb): the stack is back.
    old = node.root / "sys/module/igb"
    old.rename(node.root / "sys/module/.igb-unloaded")
    assert read_pause(sysfs, now + 1) is not None
    node.module("igb")
    assert read_pause(sysfs, now + 1) is None
    # A module not loaded when the pause began is back once it is loaded.
    write_pause(sysfs, by="t", reason="r", seconds=60, modules=["nvidia"], now=now)
    assert read_pause(sysfs, now + 1) is not None
    node.module("nvidia")
    assert read_pause(sysfs, now + 1) is None


def test_a_broken_or_absurd_pause_file_is_no_pause(node: FakeSysfs) -> None:
    sysfs = Sysfs(node.root)
    node.write(PAUSE_FILE, "{not json")
    assert read_pause(sysfs, 10.0) is None
    node.write(
        PAUSE_FILE, json.dumps({"by": "x", "reason": "y", "since": 0, "until": 1e9, "modules": {}})
    )
    assert read_pause(sysfs, 10.0) is None  # longer than MAX_PAUSE: a stepped clock
    assert write_pause(sysfs, by="x", reason="y", seconds=1e9, modules=[], now=5.0).until == 3605.0


def test_hook_file_is_written_atomically_recognised_and_removed(tmp_path: Path) -> None:
    fs = FakeSysfs(tmp_path)
    fs.write("etc/modprobe.d/other.conf", "options igb max_vfs=7")
    sysfs = Sysfs(tmp_path)
    assert observe_hook(sysfs).present is False
    command = guard_command()
    write_hook(sysfs, ["mlx5_core", "igb"], command)
    text = (tmp_path / HOOK_FILE).read_text()
    assert f"remove igb [ -e {command.split()[0]} ] || " in text
    assert f"; exec {command} remove igb\n" in text
    seen = observe_hook(sysfs)
    assert seen.present and seen.current and seen.modules == {"igb", "mlx5_core"}
    assert observe_hook(sysfs, "/other/python -I -m rdmad.guard").current is False
    assert sorted(os.listdir(tmp_path / "etc/modprobe.d")) == ["other.conf", "rdmad-guard.conf"]
    write_hook(sysfs, [], command)
    assert not (tmp_path / HOOK_FILE).exists()
    with pytest.raises(ValueError):
        render(["igb;reboot"], command)


def test_the_guard_imports_no_daemon_stack() -> None:
    """It runs inside `modprobe -r`: no msgspec, aiohttp, structlog; asyncio only for RDMA."""
    code = (
        "import sys, rdmad.guard.cli; "
        "heavy = {'msgspec', 'aiohttp', 'structlog', 'pyudev', 'prometheus_client', 'asyncio'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert out.stdout.strip() == "[]"
