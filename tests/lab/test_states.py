"""The saved-state cache (states.py) on the host: made once per inputs, kept between
runs, one maker at a time, nothing half-made kept, old states pruned unless held.

No guest: ``make`` writes a stand-in file; what a state holds is the harness's job
(test_lab_guest.py starts guests from the real ones)."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from states import KEEP, StateCache, state_key

INPUTS = {"image": "img-1", "qemu": "QEMU 10.0.2"}


class Maker:
    """A ``make``: writes a file, counts its calls, can fail or wait on an event."""

    def __init__(self, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.calls = 0
        self.fail = fail
        self.gate = gate
        self.started = threading.Event()

    def __call__(self, directory: Path) -> dict[str, Any]:
        self.calls += 1
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30)
        (directory / "state").write_text("stream")
        if self.fail:
            raise OSError("the guest died")
        return {"boot_id": f"boot-{self.calls}"}


def cache(root: Path) -> StateCache:
    return StateCache(root, lambda message: None)


def test_made_once_then_kept_by_later_runs(tmp_path: Path) -> None:
    make = Maker()
    first = cache(tmp_path)
    directory, doc = first.obtain("clean", INPUTS, make)
    assert make.calls == 1
    assert (directory / "state").read_text() == "stream"
    assert doc == {"boot_id": "boot-1"}
    first.release()

    again = Maker()
    later = cache(tmp_path)  # another run
    assert later.obtain("clean", dict(reversed(INPUTS.items())), again) == (directory, doc)
    assert again.calls == 0
    later.release()


def test_another_input_is_another_state(tmp_path: Path) -> None:
    c = cache(tmp_path)
    a, _ = c.obtain("clean", INPUTS, Maker())
    b, _ = c.obtain("clean", {**INPUTS, "qemu": "QEMU 10.1.0"}, Maker())
    assert a != b
    assert a.name == f"clean-{state_key(INPUTS)}"
    c.release()


def test_a_failed_make_keeps_nothing_and_the_next_one_makes_it(tmp_path: Path) -> None:
    c = cache(tmp_path)
    with pytest.raises(OSError, match="the guest died"):
        c.obtain("clean", INPUTS, Maker(fail=True))
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == []
    make = Maker()
    c.obtain("clean", INPUTS, make)
    assert make.calls == 1
    c.release()


def test_one_maker_at_a_time_the_other_uses_its_state(tmp_path: Path) -> None:
    gate = threading.Event()
    first_make, second_make = Maker(gate=gate), Maker()
    results: dict[str, tuple[Path, dict[str, Any]]] = {}
    first, second = cache(tmp_path), cache(tmp_path)
    one = threading.Thread(target=lambda: results.update(a=first.obtain("s", INPUTS, first_make)))
    one.start()
    assert first_make.started.wait(30)  # the first one is making it, under the lock
    two = threading.Thread(target=lambda: results.update(b=second.obtain("s", INPUTS, second_make)))
    two.start()
    gate.set()
    one.join(30)
    two.join(30)
    assert not one.is_alive() and not two.is_alive()
    assert first_make.calls == 1 and second_make.calls == 0
    assert results["a"] == results["b"]
    first.release()
    second.release()


def _states(root: Path, name: str) -> list[Path]:
    return sorted(p for p in root.glob(f"{name}-*") if p.is_dir())


def test_old_states_beyond_keep_are_removed_unless_a_pool_holds_them(tmp_path: Path) -> None:
    holder = cache(tmp_path)
    held, _ = holder.obtain("s", {"v": "0"}, Maker())  # held for the whole test
    c = cache(tmp_path)
    made = []
    for v in range(1, KEEP + 3):
        directory, _ = c.obtain("s", {"v": str(v)}, Maker())
        made.append(directory)
        c.release()
    left = _states(tmp_path, "s")
    assert held in left, "a held state was removed"
    assert made[-1] in left
    assert [d for d in made if d in left] == made[-KEEP:], left
    holder.release()


def test_what_a_killed_maker_left_is_removed(tmp_path: Path) -> None:
    # A pid that is certainly not running: a child that has exited and was reaped.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    leftover = tmp_path / f"s-0123456789abcdef.tmp-{dead}"
    leftover.mkdir()
    (leftover / "state").write_text("half")
    c = cache(tmp_path)
    c.obtain("s", INPUTS, Maker())
    assert not leftover.exists()
    c.release()
