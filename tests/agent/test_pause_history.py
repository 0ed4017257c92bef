"""Pauses and resumes in the history, from the pause records observations read: who
asked, for how long, why it ended; told once, across a restart too."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rdmad.model import Observed
from rdmad.model.observed import PauseObserved
from rdmad.status import HistoryEntry
from rdmad.triggers import Trigger
from tests.agent.conftest import FakeHost, Rig, RigFactory, desired
from tests.support.records import replace

BY = "`modprobe -r igb` (pid 812 (modprobe), uid 0)"


@dataclass
class PausingHost(FakeHost):
    record: PauseObserved | None = None

    async def observe(self) -> Observed:
        seen = await super().observe()
        in_force = self.record if self.record and self.record.ended_why is None else None
        return replace(seen, pause=in_force, pause_record=self.record)


def told(r: Rig) -> list[HistoryEntry]:
    return [h for h in r.agent.status.history() if h.event in ("paused", "resumed")]


async def poke(r: Rig) -> None:
    r.agent.queue.put(Trigger("udev", "module"))
    await r.idle()


async def test_a_pause_and_its_end_are_told_once_with_who_and_why(rig: RigFactory) -> None:
    host = PausingHost()
    r = await rig(desired(("rxe0", "eth0")), host=host).start()
    since = r.clock.wall()
    host.record = PauseObserved(BY, "guarded stop of the RDMA stack", since, since + 120,
                                ("ib_core", "igb"))  # fmt: skip
    await poke(r)
    await poke(r)  # seen again: not told again
    [paused] = told(r)
    assert (paused.at, paused.cause, paused.reason) == (since, BY, "guarded stop of the RDMA stack")
    assert paused.what == (
        "no module loads, no rxe links: for at most 120 s, or until ib_core or igb is loaded again"
    )
    host.record = replace(host.record, ended_at=since + 1.5, ended_why="igb is loaded again")
    await poke(r)
    await poke(r)
    [_, resumed] = told(r)
    assert (resumed.at, resumed.cause) == (since + 1.5, BY)
    assert resumed.what == "after 1.5 s: igb is loaded again"
    assert resumed.reason == "igb is loaded again"
    await r.stop()


async def test_a_pause_over_before_any_pass_saw_it_is_told_whole(rig: RigFactory) -> None:
    """A failed unload: the guard paused and resumed between two passes."""
    host = PausingHost()
    r = await rig(desired(("rxe0", "eth0")), host=host).start()
    t = r.clock.wall()
    why = "the unload of igb failed (modprobe exit 1): igb is still loaded"
    host.record = PauseObserved(BY, "guarded stop", t, t + 120, ("igb",), t + 0.2, why)
    await poke(r)
    assert [(h.event, h.at, h.reason) for h in told(r)] == [
        ("paused", t, "guarded stop"),
        ("resumed", t + 0.2, why),
    ]
    # The file gone later (a reboot empties /run): nothing more to tell.
    host.record = None
    await poke(r)
    assert len(told(r)) == 2
    await r.stop()


async def test_a_restart_does_not_tell_a_pause_again_and_tells_its_end(
    rig: RigFactory, tmp_path: Path
) -> None:
    state_dir = tmp_path / "st"
    host = PausingHost()
    r = await rig(desired(("rxe0", "eth0")), host=host, state_dir=state_dir).start()
    t = r.clock.wall()
    host.record = PauseObserved("rdmad-ctl pause (uid 0, pid 9)", "MOFED upgrade", t, t + 300)
    await poke(r)
    await r.stop()
    r2 = await rig(desired(("rxe0", "eth0")), host=host, state_dir=state_dir).start()
    await r2.idle()
    assert [h.event for h in told(r2)] == ["paused"]  # the one the first run told
    host.record = None  # `rm` by hand
    await poke(r2)
    assert [(h.event, h.reason) for h in told(r2)] == [
        ("paused", "MOFED upgrade"),
        ("resumed", "the pause file is gone"),
    ]
    await r2.stop()
