"""The guard pauses rdmad only for an unload that goes ahead, and ends the pause when
the unload failed; a stack stop that stopped nothing is no pause either.

``remove`` runs the unload itself (here a stand-in for ``modprobe -r`` that changes the
fake tree as the kernel would, or fails); the real modprobe path is in
tests/lab/test_guard_lab.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rdmad.guard import cli
from rdmad.kernel.guardhook import HOOK_FILE, guard_command, observe_hook, render, write_hook
from rdmad.kernel.pause import PAUSE_FILE, read_pause, read_pause_record, write_pause
from rdmad.kernel.sysfs import Sysfs
from tests.support.fakesysfs import FakeSysfs, mlx5_node


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSysfs:
    monkeypatch.delenv("RDMAD_GUARD_FORCE", raising=False)
    fs = mlx5_node(tmp_path)
    fs.driver_module("mlx5_core", "mlx5_core")
    fs.driver_module("igb", "igb")
    fs.module("ib_core")
    fs.write("run/rdmad/.keep", "")
    return fs


def unloads(node: FakeSysfs, module: str, status: int = 0) -> Callable[[str], int]:
    """A ``modprobe -r`` that takes ``module`` away (status 0) or leaves it (any other),
    checking that rdmad stood back before it ran."""
    calls: list[str] = []

    def run(name: str) -> int:
        calls.append(name)
        assert read_pause(Sysfs(node.root), time.time()) is not None, "not paused before"
        if status == 0:
            (node.root / f"sys/module/{module}").rename(node.root / f"sys/module/.{module}-gone")
        return status

    run.calls = calls  # type: ignore[attr-defined]
    return run


def never(name: str) -> int:
    raise AssertionError(f"modprobe -r {name} must not run")


def test_a_module_that_is_not_loaded_pauses_nothing(node: FakeSysfs) -> None:
    """Issue 42: `rdmad.guard hook igb` with igb not loaded wrote a 120 s pause."""
    sysfs = Sysfs(node.root)
    assert cli.main(["hook", "ixgbe"], root=str(node.root)) == cli.EXIT_ALLOWED
    assert not (node.root / PAUSE_FILE).exists()
    ran: list[str] = []

    def not_loaded(name: str) -> int:
        ran.append(name)
        return 1

    status = cli.main(["remove", "ixgbe"], root=str(node.root), unload=not_loaded)
    assert status == 1 and ran == ["ixgbe"]  # modprobe's own "not loaded" and exit status
    assert read_pause_record(sysfs, time.time()) is None
    node.builtin_module("bonding")  # built in: modprobe -r refuses it, nothing to stand back for
    cli.main(["remove", "bonding"], root=str(node.root), unload=lambda m: 1)
    assert read_pause_record(sysfs, time.time()) is None


def test_an_unload_that_fails_ends_the_pause_at_once_saying_why(node: FakeSysfs) -> None:
    """Issue 42: a pause written before an unload that then failed kept rdmad from loading
    modules or adding rxe links for 2 minutes."""
    sysfs = Sysfs(node.root)
    unload = unloads(node, "igb", status=1)
    assert cli.main(["remove", "igb"], root=str(node.root), unload=unload) == 1
    assert unload.calls == ["igb"]  # type: ignore[attr-defined]
    assert read_pause(sysfs, time.time()) is None
    record = read_pause_record(sysfs, time.time())
    assert record is not None and record.by.startswith("`modprobe -r igb` (")
    assert record.ended_why == "the unload of igb failed (modprobe exit 1): igb is still loaded"
    assert record.ended_at is not None and record.ended_at - record.since < 10


def test_an_unload_that_goes_ahead_keeps_rdmad_back_until_the_module_returns(
    node: FakeSysfs,
) -> None:
    sysfs = Sysfs(node.root)
    unload = unloads(node, "igb")
    assert cli.main(["remove", "igb"], root=str(node.root), unload=unload) == 0
    pause = read_pause(sysfs, time.time())
    assert pause is not None and set(pause.modules) == {"ib_core", "igb"}
    node.module("igb")  # loaded again: a new /sys/module/igb
    record = read_pause_record(sysfs, time.time())
    assert read_pause(sysfs, time.time()) is None
    assert record is not None and record.ended_why == "igb is loaded again"


def test_a_refused_unload_neither_pauses_nor_unloads(node: FakeSysfs) -> None:
    assert cli.main(["remove", "mlx5_core"], root=str(node.root), unload=never) == 1
    assert not (node.root / PAUSE_FILE).exists()


def test_a_failed_unload_ends_only_its_own_pause(node: FakeSysfs) -> None:
    """Someone paused rdmad (rdmad-ctl pause) while the unload ran: theirs stays."""
    sysfs = Sysfs(node.root)

    def unload(name: str) -> int:
        write_pause(sysfs, by="rdmad-ctl pause (uid 0)", reason="r", seconds=60,
                    modules=["ib_core"], now=time.time())  # fmt: skip
        return 1

    assert cli.main(["remove", "igb"], root=str(node.root), unload=unload) == 1
    pause = read_pause(sysfs, time.time())
    assert pause is not None and pause.by == "rdmad-ctl pause (uid 0)"


def test_a_stack_stop_with_nothing_loaded_pauses_nothing(tmp_path: Path) -> None:
    bare = FakeSysfs(tmp_path)
    bare.write("run/rdmad/.keep", "")
    bare.write(HOOK_FILE, render(["igb"], guard_command()))
    assert cli.main(["stack-stop", "--by", "openibd.service"], root=str(tmp_path)) == 0
    assert not (tmp_path / PAUSE_FILE).exists()


def test_a_stack_stop_that_left_the_core_loaded_is_resumed_after_it(node: FakeSysfs) -> None:
    sysfs = Sysfs(node.root)
    node.write(HOOK_FILE, render(["igb"], guard_command()))
    by = ["--by", "openibd.service"]
    assert cli.main(["stack-stop", *by], root=str(node.root)) == 0
    assert read_pause(sysfs, time.time()) is not None
    # Another stop's name, or `rdmad-ctl pause`: not this stop's pause to end.
    assert cli.main(["stack-stopped", "--by", "other.service"], root=str(node.root)) == 0
    assert read_pause(sysfs, time.time()) is not None
    # openibd's stop failed: ib_core is the very module that was loaded when it began.
    assert cli.main(["stack-stopped", *by], root=str(node.root)) == 0
    record = read_pause_record(sysfs, time.time())
    assert record is not None and record.ended_why == (
        "openibd.service left ib_core loaded: the stack was not stopped"
    )
    # A stop that went through (ib_core gone) keeps rdmad back.
    assert cli.main(["stack-stop", *by], root=str(node.root)) == 0
    (node.root / "sys/module/ib_core").rename(node.root / "sys/module/.ib_core-gone")
    assert cli.main(["stack-stopped", *by], root=str(node.root)) == 0
    assert read_pause(sysfs, time.time()) is not None


def test_the_hook_line_runs_the_guard_which_runs_the_unload(tmp_path: Path) -> None:
    sysfs = Sysfs(tmp_path)
    (tmp_path / "etc/modprobe.d").mkdir(parents=True)
    command = guard_command()
    write_hook(sysfs, ["igb"], command)
    assert (tmp_path / HOOK_FILE).read_text().endswith(f"; exec {command} remove igb\n")
    assert observe_hook(sysfs).current
    # A file the previous rdmad wrote (no test that the guard is there) is rewritten.
    (tmp_path / HOOK_FILE).write_text(f"remove igb {command} remove igb\n")
    seen = observe_hook(sysfs)
    assert seen.modules == {"igb"} and not seen.current
    # A file an older rdmad wrote still guards igb, and is rewritten.
    (tmp_path / HOOK_FILE).write_text(
        f"remove igb {command} hook igb && exec /sbin/modprobe -r --ignore-remove igb\n"
    )
    seen = observe_hook(sysfs)
    assert seen.modules == {"igb"} and not seen.current
