"""Kernel faults at the host boundary: errnos per action and per attempt, a device that
vanishes between observe and apply, and the cost of a fault that never goes away.

The agent runs on a fake clock with real backoff jitter (a seeded random source), so
an hour of retries takes a moment and every pass can be counted. Retry spacing,
errors in status, other objects converging and the watchdog are asserted; the CPU
figure of a real-clock agent under a persistent fault is measured in a child process
and bounded only by its pass count (never by time).
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import random
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rdmad.agent import Agent, AgentOptions
from rdmad.model import Action, AddRxe, ObjectState, Observed
from rdmad.state import StateStore
from tests.agent.conftest import ConfigBox, FakeHost, FakeResult, FakeWrite, Notes, desired, until
from tests.support.fakeclock import FakeClock

REPO = Path(__file__).resolve().parents[2]
ERRNOS = (errno.EBUSY, errno.EIO, errno.ETIMEDOUT, errno.EOPNOTSUPP, errno.ENODEV)
HOUR = 3600.0
BASE, CAP, JITTER = 1.0, 300.0, 0.1


@dataclass
class FaultHost(FakeHost):
    """FakeHost whose apply() fails by plan: ``script[name]`` is the errno (or None for
    success) of each attempt in turn, the last one repeating; ``vanish`` netdevs are
    gone from the kernel once observed (between observe and apply)."""

    script: dict[str, list[int | None]] = field(default_factory=dict)
    vanish: set[str] = field(default_factory=set)
    attempts: dict[str, list[float]] = field(default_factory=dict)
    clock: FakeClock | None = None

    async def observe(self) -> Observed:
        observed = await super().observe()
        self.netdevs = [n for n in self.netdevs if n not in self.vanish]
        return observed

    async def apply(self, action: Action) -> FakeResult:
        name = getattr(action, "name", "")
        tries = self.attempts.setdefault(name, [])
        tries.append(self.clock.monotonic() if self.clock else 0.0)
        netdev = getattr(action, "netdev", None)
        if isinstance(action, AddRxe) and netdev not in self.netdevs:
            self.applied.append(action)
            err = OSError(errno.ENODEV, f"ENODEV: no netdev {netdev}")
            return FakeResult((FakeWrite(f"rdma link {name}", None, "rxe", err),))
        plan = self.script.get(name)
        if plan:
            code = plan[min(len(tries), len(plan)) - 1]
            if code is not None:
                self.applied.append(action)
                err = OSError(code, f"{errno.errorcode[code]}: rdma link {name}")
                return FakeResult((FakeWrite(f"rdma link {name}", None, "rxe", err),))
        return await super().apply(action)


def agent_on(host: FaultHost, d: object, tmp_path: Path, seed: int, **opts: object) -> Agent:
    clock = FakeClock()
    host.clock = clock
    return Agent(
        host,
        ConfigBox(d),  # type: ignore[arg-type]
        clock=clock,
        notifier=Notes(),
        state_store=StateStore(tmp_path / f"state-{seed}"),
        boot_id="boot-1",
        options=AgentOptions(
            backoff_base=BASE,
            backoff_cap=CAP,
            backoff_jitter=JITTER,
            drift_jitter=0.0,
            **opts,  # type: ignore[arg-type]
        ),
        rng=random.Random(seed).random,
    )


async def run_for(agent: Agent, seconds: float, step: float = 0.5) -> None:
    clock = agent.shared.clock
    assert isinstance(clock, FakeClock)
    for _ in range(int(seconds / step)):
        clock.advance(step)
        for _ in range(30):
            await asyncio.sleep(0)


def objects(agent: Agent) -> dict[str, object]:
    return {o.obj: o for o in agent.status.current.objects}


@pytest.mark.parametrize("code", ERRNOS, ids=[errno.errorcode[c] for c in ERRNOS])
async def test_a_persistent_errno_is_retried_with_jittered_backoff_and_named(
    code: int, tmp_path: Path
) -> None:
    """One hour of a fault that never clears: attempts follow base·2^n ± 10 % up to the
    cap, the passes stay few, status names the errno, the other links converge."""
    host = FaultHost(script={"rxe0": [code]})
    agent = agent_on(host, desired(("rxe0", "eth0"), ("rxe1", "eth1")), tmp_path, seed=code)
    task = asyncio.get_running_loop().create_task(agent.run())
    await until(lambda: len(agent.passes) >= 1, "first pass")
    await run_for(agent, HOUR)
    tries = host.attempts["rxe0"]
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    for n, gap in enumerate(gaps, start=1):
        want = min(CAP, BASE * 2 ** (n - 1))
        # Sampled in 0.5 s steps of fake time: each gap is exact to one step.
        assert want * (1 - JITTER) - 0.5 <= gap <= min(CAP, want * (1 + JITTER)) + 0.5, gaps
    # 1+2+...+256 s, then one attempt per 270-300 s: ~ 9 + 12 in an hour.
    assert 15 <= len(tries) <= 25, len(tries)
    assert len(agent.passes) <= 3 * len(tries) + 5  # no pass without a reason
    assert host.links == {"rxe1": "eth1"}
    state = objects(agent)
    assert state["rxe rxe1"].state is ObjectState.CONVERGED  # type: ignore[attr-defined]
    failed = state["rxe rxe0"]
    assert failed.state is ObjectState.DEGRADED  # type: ignore[attr-defined]
    assert errno.errorcode[code] in (failed.last_error or "")  # type: ignore[attr-defined]
    print(f"{errno.errorcode[code]}: {len(tries)} attempts, {len(agent.passes)} passes in 1 h")
    agent.stop()
    await asyncio.wait_for(task, 5)


async def test_jitter_spreads_the_retries_of_two_nodes(tmp_path: Path) -> None:
    """Two agents with the same fault but different random sources retry at different
    times (a fleet does not hammer a shared dependency in lockstep)."""
    times = []
    for seed in (1, 2):
        host = FaultHost(script={"rxe0": [errno.EBUSY]})
        agent = agent_on(host, desired(("rxe0", "eth0")), tmp_path, seed=seed)
        task = asyncio.get_running_loop().create_task(agent.run())
        await until(lambda a=agent: len(a.passes) >= 1, "first pass")  # type: ignore[misc]
        await run_for(agent, 600.0, step=0.1)
        times.append(host.attempts["rxe0"])
        agent.stop()
        await asyncio.wait_for(task, 5)
    assert len(times[0]) >= 8 and len(times[1]) >= 8
    assert [round(t, 1) for t in times[0][3:8]] != [round(t, 1) for t in times[1][3:8]]


async def test_a_fault_mid_sequence_fails_one_object_and_the_rest_apply(tmp_path: Path) -> None:
    """EIO on the second of three actions of one pass, twice; then it clears: the first
    and third converge at once, the second after its retries, nothing applied twice."""
    host = FaultHost(script={"rxe1": [errno.EIO, errno.EIO, None]})
    d = desired(("rxe0", "eth0"), ("rxe1", "eth1"), ("rxe2", "eth2"))
    agent = agent_on(host, d, tmp_path, seed=7)
    task = asyncio.get_running_loop().create_task(agent.run())
    await until(lambda: len(agent.passes) >= 1, "first pass")
    assert host.links == {"rxe0": "eth0", "rxe2": "eth2"}
    await run_for(agent, 30.0)
    assert host.links == {"rxe0": "eth0", "rxe1": "eth1", "rxe2": "eth2"}
    assert [len(host.attempts[n]) for n in ("rxe0", "rxe1", "rxe2")] == [1, 3, 1]
    assert all(o.state is ObjectState.CONVERGED for o in agent.status.current.objects)  # type: ignore[attr-defined]
    agent.stop()
    await asyncio.wait_for(task, 5)


async def test_a_netdev_that_vanishes_between_observe_and_apply(tmp_path: Path) -> None:
    """eth1 is gone when its rxe link is applied: ENODEV once, then the next pass sees
    it missing and waits for it (no retry storm); when it comes back, it converges."""
    host = FaultHost(vanish={"eth1"})
    agent = agent_on(host, desired(("rxe0", "eth0"), ("rxe1", "eth1")), tmp_path, seed=3)
    task = asyncio.get_running_loop().create_task(agent.run())
    await until(lambda: len(agent.passes) >= 1, "first pass")
    await run_for(agent, 600.0)
    assert host.links == {"rxe0": "eth0"}
    assert len(host.attempts["rxe1"]) == 1  # the vanished device is not hammered
    rxe1 = objects(agent)["rxe rxe1"]
    assert rxe1.state is not ObjectState.CONVERGED  # type: ignore[attr-defined]
    assert "eth1" in rxe1.message  # type: ignore[attr-defined]
    print("vanished:", rxe1.state, rxe1.message)  # type: ignore[attr-defined]
    host.vanish.clear()
    host.netdevs.append("eth1")
    agent.trigger("udev", "eth1 added")
    await run_for(agent, 30.0)
    assert host.links == {"rxe0": "eth0", "rxe1": "eth1"}
    agent.stop()
    await asyncio.wait_for(task, 5)


async def test_the_watchdog_keeps_pinging_through_an_hour_of_failures(tmp_path: Path) -> None:
    """Failing and backing off is not being stuck: WATCHDOG=1 is never withheld (it is
    withheld only for an action past its budget: tests/agent/test_lifecycle.py)."""
    host = FaultHost(script={"rxe0": [errno.ETIMEDOUT]})
    agent = agent_on(host, desired(("rxe0", "eth0")), tmp_path, seed=5, watchdog_interval=10.0)
    notes = agent.reporter.notifier
    task = asyncio.get_running_loop().create_task(agent.run())
    await until(lambda: len(agent.passes) >= 1, "first pass")
    await run_for(agent, HOUR)
    assert isinstance(notes, Notes)
    assert notes.count("WATCHDOG=1") >= HOUR / 10.0 - 2
    agent.stop()
    await asyncio.wait_for(task, 5)


def test_cpu_of_an_agent_under_a_persistent_fault(tmp_path: Path) -> None:
    """The real clock, 10 s of EBUSY on one link: the child reports its CPU seconds and
    passes. The figure goes to RELIABILITY.md; the assertion is on passes only."""
    out = subprocess.run(
        [sys.executable, "-m", "tests.reliability.fault_worker", str(tmp_path), "10"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print("persistent-fault", json.dumps(result))
    assert result["attempts"] >= 3  # it kept trying
    assert result["passes"] <= 3 * result["attempts"] + 5  # and never spun
