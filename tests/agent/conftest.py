"""A fake host, a fake clock and helpers for driving the agent without sleeping."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from rdmad.agent import Agent, AgentOptions
from rdmad.config import ConfigError, ConfigInvalid, LoadedConfig
from rdmad.model import (
    Action,
    AddRxe,
    DeleteRxe,
    Desired,
    ModulesObserved,
    NetdevObserved,
    Observed,
    RdmaLinkObserved,
)
from rdmad.model.validation import validate
from rdmad.state import StateStore
from tests.support.fakeclock import FakeClock


@dataclass(frozen=True)
class FakeWrite:
    target: str
    old: object
    new: object
    error: BaseException | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class FakeResult:
    writes: tuple[FakeWrite, ...]
    note: str = ""
    stale: bool = False

    @property
    def ok(self) -> bool:
        return all(w.error is None for w in self.writes)


@dataclass
class FakeHost:
    """rxe links over a few netdevs; failures injected per rxe name."""

    netdevs: list[str] = field(default_factory=lambda: ["eth0", "eth1", "eth2"])
    links: dict[str, str] = field(default_factory=dict)  # rxe name -> netdev
    fail: dict[str, int] = field(default_factory=dict)  # rxe name -> errno
    ignore: set[str] = field(default_factory=set)  # "succeeds" without effect
    gate: asyncio.Event | None = None  # apply() blocks until set
    on_observe: Callable[[], None] | None = None
    observes: int = 0
    applied: list[Action] = field(default_factory=list)
    in_apply: bool = False

    async def observe(self) -> Observed:
        self.observes += 1
        if self.on_observe is not None:
            self.on_observe()
        return Observed(
            netdevs=tuple(NetdevObserved(n, i + 1) for i, n in enumerate(self.netdevs)),
            rdma_links=tuple(RdmaLinkObserved(k, "rxe", v) for k, v in sorted(self.links.items())),
            modules=ModulesObserved(frozenset({"rdma_rxe"})),
        )

    async def apply(self, action: Action) -> FakeResult:
        self.in_apply = True
        try:
            if self.gate is not None:
                await self.gate.wait()
            self.applied.append(action)
            name = getattr(action, "name", "")
            target = f"rdma link {name}"
            if name in self.fail:
                code = self.fail[name]
                err = OSError(code, f"{errno.errorcode[code]}: {target}")
                return FakeResult((FakeWrite(target, None, "rxe", err),))
            if name in self.ignore:
                return FakeResult((FakeWrite(target, None, "rxe"),))
            if isinstance(action, AddRxe):
                self.links[action.name] = action.netdev
                return FakeResult((FakeWrite(target, None, f"rxe on {action.netdev}"),))
            if isinstance(action, DeleteRxe):
                old = self.links.pop(action.name, None)
                return FakeResult((FakeWrite(target, old, None),))
            return FakeResult((FakeWrite(action.describe(), None, None),))
        finally:
            self.in_apply = False


def desired(*rxe: tuple[str, str], **daemon: Any) -> Desired:
    return validate(
        Desired,
        {
            "daemon": daemon,
            "rxe": [{"name": n, "netdev": {"name": d}} for n, d in rxe],
        },
    )


class ConfigBox:
    """What load_config returns; set ``errors`` to make it invalid."""

    def __init__(self, d: Desired) -> None:
        self.desired = d
        self.errors: list[str] = []
        self.loads = 0

    def __call__(self) -> LoadedConfig:
        self.loads += 1
        if self.errors:
            raise ConfigInvalid([ConfigError("/etc/rdmad/rdmad.toml", "", e) for e in self.errors])
        return LoadedConfig(self.desired, ("/etc/rdmad/rdmad.toml",))


class Notes:
    """A recording sd_notify."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def notify(self, state: str) -> None:
        self.sent.append(state)

    def count(self, prefix: str) -> int:
        return sum(1 for s in self.sent if s.startswith(prefix))


async def until(pred: Callable[[], bool], what: str = "condition", steps: int = 2000) -> None:
    """Yield to the loop until pred() holds; bounded in steps, never a wall-clock sleep."""
    for _ in range(steps):
        if pred():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what} not reached within {steps} loop iterations")


async def spin(steps: int = 50) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)


@dataclass
class Rig:
    agent: Agent
    host: FakeHost
    clock: FakeClock
    cfg: ConfigBox
    notes: Notes
    task: asyncio.Task[None] | None = None

    async def start(self) -> Rig:
        self.task = asyncio.get_running_loop().create_task(self.agent.run())
        await until(lambda: len(self.agent.passes) >= 1, "first pass")
        return self

    async def advance(self, seconds: float, step: float | None = None) -> None:
        """Move fake time, letting the agent run between steps."""
        step = step or seconds
        left = seconds
        while left > 1e-12:
            dt = min(step, left)
            self.clock.advance(dt)
            left -= dt
            await spin()

    async def idle(self) -> None:
        """Let follow-ups run until the loop is idle (bounded)."""
        for _ in range(20):
            await self.advance(self.agent.options.settle_max + 0.01)
        await spin()

    async def stop(self) -> None:
        self.agent.stop()
        if self.task is not None:
            await asyncio.wait_for(self.task, 5)


RigFactory = Callable[..., Rig]


@pytest.fixture
def rig(tmp_path: Any) -> AsyncIterator[RigFactory] | RigFactory:
    made: list[Rig] = []

    def make(
        d: Desired | None = None,
        host: FakeHost | None = None,
        state_dir: Any = None,
        boot_id: str = "boot-1",
        **options: Any,
    ) -> Rig:
        clock = FakeClock()
        cfg = ConfigBox(d if d is not None else desired(("rxe0", "eth0")))
        notes = Notes()
        h = host or FakeHost()
        opts = AgentOptions(backoff_jitter=0.0, drift_jitter=0.0, **options)
        agent = Agent(
            h,
            cfg,
            clock=clock,
            notifier=notes,
            state_store=StateStore(state_dir or tmp_path / "state"),
            boot_id=boot_id,
            options=opts,
            rng=lambda: 0.5,
        )
        r = Rig(agent, h, clock, cfg, notes)
        made.append(r)
        return r

    return make
