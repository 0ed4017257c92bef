"""openibd.service's drop-in on a fake host: planned only while a guard is declared,
written from the unit's own ExecStop= (not a fixed command), systemd told to reload,
removed when nothing is guarded; the empty config writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdmad.kernel.apply.host import KernelHost
from rdmad.kernel.apply.observe import observe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Desired, PlanState, SyncOpenibdDropin
from rdmad.model.validation import validate
from rdmad.openibd import DROPIN, dropin_runs
from rdmad.reconcile import plan
from tests.support.fakesysfs import IGB_PF, FakeSysfs, mlx5_node

UNIT = "usr/lib/systemd/system/openibd.service"


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSysfs:
    fs = mlx5_node(tmp_path / "root")
    fs.driver_module("igb", "igb")
    fs.write(UNIT, "[Service]\nType=oneshot\nExecStop=/usr/sbin/doca-openibd --stop\n")
    # A systemctl that records what it was asked.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >>{tmp_path}/systemctl.log\n')
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return fs


def guarded() -> Desired:
    return validate(Desired, {"sriov": [{"pf": {"pci": IGB_PF}, "numvfs": 0}]})


def dropin_actions(d: Desired, root: Path) -> list[SyncOpenibdDropin]:
    actions = plan(d, observe(Sysfs(root)), PlanState())
    return [a for a in actions if isinstance(a, SyncOpenibdDropin)]


def reloads(node: FakeSysfs) -> list[str]:
    log = node.root.parent / "systemctl.log"
    return log.read_text().splitlines() if log.exists() else []


async def test_declared_guard_writes_what_the_unit_runs_and_reloads(node: FakeSysfs) -> None:
    root = node.root
    assert dropin_actions(Desired(), root) == []  # the empty config: no drop-in
    [write] = dropin_actions(guarded(), root)
    assert write.write
    result = await KernelHost(str(root)).apply(write)
    assert result.ok, result
    text = (root / DROPIN).read_text()
    assert dropin_runs(text) == ("/usr/sbin/doca-openibd --stop",)
    assert "/etc/init.d/openibd" not in text
    assert reloads(node) == ["daemon-reload"]
    assert dropin_actions(guarded(), root) == []  # current: nothing more
    # The unit's stop changes (a DOCA upgrade): the drop-in follows it.
    node.write(UNIT, "[Service]\nExecStop=/opt/mellanox/openibd stop\n")
    [rewrite] = dropin_actions(guarded(), root)
    assert (await KernelHost(str(root)).apply(rewrite)).ok
    assert dropin_runs((root / DROPIN).read_text()) == ("/opt/mellanox/openibd stop",)
    # Nothing guarded any more: removed, and systemd told again.
    [remove] = dropin_actions(Desired(), root)
    assert not remove.write and (await KernelHost(str(root)).apply(remove)).ok
    assert not (root / DROPIN).exists()
    assert reloads(node) == ["daemon-reload"] * 3


async def test_a_failed_reload_is_the_actions_error(node: FakeSysfs) -> None:
    (node.root.parent / "bin/systemctl").write_text("#!/bin/sh\necho 'Access denied' >&2\nexit 1\n")
    [write] = dropin_actions(guarded(), node.root)
    result = await KernelHost(str(node.root)).apply(write)
    assert not result.ok
    assert "systemctl daemon-reload" in str(result.errors[0]) and "Access denied" in str(
        result.errors[0]
    )
    # Not in force, so not left to look current: the next pass writes it and asks again.
    assert not (node.root / DROPIN).exists()
    assert [a.write for a in dropin_actions(guarded(), node.root)] == [True]
