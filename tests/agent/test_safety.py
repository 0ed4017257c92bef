"""The agent's safety rules: what it holds back, what it remembers, what it survives.

A ``SimHost`` drives the agent over the simulated kernel of the planner tests
(tests/support/simkernel.py), with errors injected per action or VF attribute.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from structlog.testing import capture_logs

from rdmad.model import (
    Action,
    AddRxe,
    Desired,
    NetdevObserved,
    Observed,
    PfObserved,
    PlanState,
    SetNumVfs,
    SetVfSettings,
    Usage,
    Use,
)
from rdmad.model.validation import validate
from rdmad.reconcile import plan
from tests.agent.conftest import FakeHost, FakeResult, FakeWrite, RigFactory, desired, until
from tests.support.records import replace
from tests.support.simkernel import SimError, SimKernel, make_vfs

PF = "0000:01:00.0"


def igb_like(numvfs: int) -> Observed:
    pf = PfObserved(
        pci=PF,
        driver="igb",
        netdev="enp1s0",
        ifindex=3,
        mac="52:54:00:12:34:56",
        perm_mac="52:54:00:12:34:56",
        numvfs=numvfs,
        totalvfs=7,
    )
    return Observed(
        netdevs=(NetdevObserved("enp1s0", 3),),
        pfs=(replace(pf, vfs=make_vfs(pf, numvfs)),),
    )


def sriov(numvfs: int, *vfs: dict[str, object], **daemon: object) -> Desired:
    return validate(
        Desired,
        {"daemon": daemon, "sriov": [{"pf": {"pci": PF}, "numvfs": numvfs, "vf": list(vfs)}]},
    )


@dataclass
class SimHost:
    """The simulated kernel as a host: ``refuse`` maps a VF attribute to the errno the
    driver answers it with; ``fail_once`` fails the next action matching a predicate."""

    kernel: SimKernel
    refuse: dict[str, int] = field(default_factory=dict)
    fail_next: list[tuple[Callable[[Action], bool], int]] = field(default_factory=list)
    applied: list[Action] = field(default_factory=list)
    attempts: list[tuple[int, str, object]] = field(default_factory=list)  # (vf, attr, value)
    observe_error: Exception | None = None

    async def observe(self) -> Observed:
        if self.observe_error is not None:
            raise self.observe_error
        return self.kernel.observed

    async def apply(self, action: Action) -> FakeResult:
        self.applied.append(action)
        for i, (match, code) in enumerate(self.fail_next):
            if match(action):
                del self.fail_next[i]
                return FakeResult((FakeWrite(action.describe(), None, None, OSError(code, "no")),))
        if isinstance(action, SetVfSettings):
            return self._vf_settings(action)
        try:
            self.kernel.apply(action)
        except SimError as exc:
            return FakeResult((FakeWrite(action.describe(), None, None, OSError(exc.code, "x")),))
        return FakeResult((FakeWrite(action.describe(), None, None),))

    def _vf_settings(self, action: SetVfSettings) -> FakeResult:
        # Per attribute, in the order of action.changes, as the real host reports them.
        writes = []
        kept = []
        for c in action.changes:
            self.attempts.append((c.vf, c.attr, c.new))
            code = self.refuse.get(c.attr)
            target = f"{action.pf_netdev} vf {c.vf} {c.attr}"
            if code is None:
                kept.append(c)
                writes.append(FakeWrite(target, c.old, c.new))
            else:
                writes.append(FakeWrite(target, c.old, c.new, OSError(code, "refused")))
        if kept:
            self.kernel.apply(msgspec.structs.replace(action, changes=tuple(kept)))
        return FakeResult(tuple(writes))


async def test_unsupported_attribute_is_reported_not_retried_and_ready_comes_at_once(
    rig: RigFactory,
) -> None:
    host = SimHost(SimKernel(igb_like(0)), refuse={"link_state": errno.EOPNOTSUPP})
    d = sriov(2, {"index": 0, "link_state": "enable", "trust": True}, drift_interval="1m")
    with capture_logs() as logs:
        r = rig(d, host=host, startup_timeout=1000.0)  # READY must not need the deadline
        await r.start()
        await r.idle()
        [ready] = [e for e in logs if e["event"] == "agent.ready"]
        assert ready["why"] == "first reconcile done"
        await r.advance(400.0, step=20.0)  # several drift passes
        await r.idle()
    assert host.attempts.count((0, "link_state", "enable")) == 1, host.attempts
    assert (0, "trust", True) in host.attempts
    [report] = r.agent.status.current.objects
    assert report.state.value == "unsupported-by-driver"
    assert "link_state" in report.message and "igb" in report.message
    said = [e for e in logs if e["event"] == "vf.attribute-unsupported"]
    assert len(said) == 1 and said[0]["driver"] == "igb"
    assert len([e for e in logs if e["event"] == "object.unsupported"]) == 1
    assert r.agent.backoff.get(d.sriov[0].obj) is None  # not degraded, not in backoff

    # A config reload forgets what was refused: the declaration may have changed.
    r.agent.request_reload()
    await r.idle()
    assert host.attempts.count((0, "link_state", "enable")) == 2
    await r.stop()


async def test_a_held_action_holds_the_rest_of_its_object(rig: RigFactory) -> None:
    # numvfs 4 -> 2 goes 4 -> 0 -> 2. While 4 -> 0 waits in backoff, 0 -> 2 must not run:
    # it would fail (EBUSY) at best, or act on a plan whose first step never happened.
    host = SimHost(SimKernel(igb_like(4)))
    host.fail_next.append((lambda a: isinstance(a, SetNumVfs) and a.new == 0, errno.EBUSY))
    r = rig(sriov(2), host=host, backoff_base=100.0, backoff_cap=300.0)
    await r.start()
    await r.idle()
    r.agent.trigger("udev", "change pci 0000:01:00.0")  # a new pass inside the backoff
    await r.idle()
    numvfs = [(a.old, a.new) for a in host.applied if isinstance(a, SetNumVfs)]
    assert numvfs == [(4, 0)], numvfs
    await r.advance(100.0)  # the retry: both steps now
    await r.idle()
    numvfs = [(a.old, a.new) for a in host.applied if isinstance(a, SetNumVfs)]
    assert numvfs == [(4, 0), (4, 0), (0, 2)], numvfs
    await r.stop()


async def test_drift_on_an_in_use_vf_is_logged_once_and_left_alone(rig: RigFactory) -> None:
    o = igb_like(2)
    pf = o.pfs[0]
    held = Usage(Use.IN_USE, ("pid 77 (qemu-system-x86) holds /dev/vfio/12",))
    vfs = (pf.vfs[0], replace(pf.vfs[1], usage=held))
    host = SimHost(SimKernel(replace(o, pfs=(replace(pf, vfs=vfs),))))
    d = sriov(2, {"index": 1, "mac": "02:00:00:00:00:07"}, drift_interval="1m")
    with capture_logs() as logs:
        r = await rig(d, host=host).start()
        await r.idle()
        await r.advance(300.0, step=20.0)
        await r.idle()
    assert not any(isinstance(a, SetVfSettings) for a in host.applied)
    drift = [e for e in logs if e["event"] == "object.drift-in-use"]
    assert len(drift) == 1 and "pid 77" in drift[0]["reason"]
    [report] = r.agent.status.current.objects
    assert report.state.value == "drift-on-in-use-vf"
    await r.stop()


async def test_reloading_is_always_answered_by_ready(rig: RigFactory) -> None:
    host = SimHost(SimKernel(igb_like(2)))
    r = await rig(sriov(2), host=host).start()
    await r.idle()
    assert r.agent.ready
    host.observe_error = OSError(errno.EIO, "netlink went away")
    r.agent.request_reload()
    await r.idle()
    assert r.notes.count("RELOADING=1") == 1
    assert r.notes.count("READY=1") == 2  # start-up, and the end of the failed reload pass
    last = [n for n in r.notes.sent if n.startswith(("RELOADING=1", "READY=1"))][-1]
    assert last.startswith("READY=1")
    await r.stop()


async def test_a_crash_in_plan_is_contained(rig: RigFactory) -> None:
    host = SimHost(SimKernel(igb_like(0)))
    crashes = [RuntimeError("bug in a planner rule")]

    def planner(d: Desired, o: Observed, s: PlanState) -> list[Action]:
        if crashes:
            raise crashes.pop()
        return plan(d, o, s)

    with capture_logs() as logs:
        r = rig(sriov(2), host=host, backoff_base=5.0)
        r.agent.planner = planner
        await r.start()
        await until(lambda: "plan" in "".join(r.agent.status.current.notes), "plan error noted")
        assert "internal error in plan(): bug in a planner rule" in r.agent.status.current.notes
        await r.advance(6.0)  # the retry
        await r.idle()
    assert any(e["event"] == "plan.crashed" for e in logs)
    assert host.kernel.observed.pfs[0].numvfs == 2  # converged after the crash
    assert not any("plan" in n for n in r.agent.status.current.notes)
    assert r.task is not None and not r.task.done()
    await r.stop()


async def test_stale_events_abort_only_what_they_touch(rig: RigFactory) -> None:
    host = FakeHost(netdevs=["eth0", "eth1", "eth2"])
    stale: list[tuple[str, frozenset[str]]] = []

    def during_first_apply() -> None:
        if len(host.applied) == 1 and stale:
            detail, touches = stale.pop()
            r.agent.trigger("netlink", detail, stale=True, touches=touches)

    original = host.apply

    async def apply(action: Action) -> FakeResult:
        result = await original(action)
        during_first_apply()
        return result

    host.apply = apply  # type: ignore[method-assign]
    # Pod churn: a veth nobody declared goes away while the plan is being applied.
    stale.append(("del veth7f3a", frozenset({"veth7f3a", "ifindex:99"})))
    r = rig(desired(("rxe0", "eth0"), ("rxe1", "eth1")), host=host)
    await r.start()
    first_pass = [a.netdev for a in host.applied if isinstance(a, AddRxe)]
    assert first_pass == ["eth0", "eth1"]  # both in the first pass, nothing aborted
    await r.idle()

    # A rename of a netdev the plan still uses holds that action until re-observed.
    host.links.clear()
    host.applied.clear()
    stale.append(("change eth5 (was eth1)", frozenset({"eth1", "eth5", "ifindex:2"})))
    passes = len(r.agent.passes)
    r.agent.trigger("netlink", "del rxe links")
    await until(lambda: len(r.agent.passes) > passes, "the next pass")
    assert [a.netdev for a in host.applied if isinstance(a, AddRxe)] == ["eth0"]
    await r.idle()
    assert host.links == {"rxe0": "eth0", "rxe1": "eth1"}  # re-observed, then applied
    await r.stop()


async def test_a_vanished_managed_rxe_name_is_forgotten(rig: RigFactory) -> None:
    host = FakeHost()
    r = await rig(desired(("rxe0", "eth0")), host=host).start()
    await r.idle()
    assert r.agent.state.managed_rxe == {"rxe0"}
    # Someone deletes rxe0 and the declaration goes; later a hand-made link takes the name.
    del host.links["rxe0"]
    r.cfg.desired = desired()
    r.agent.request_reload()
    await r.idle()
    assert r.agent.state.managed_rxe == set()
    host.links["rxe0"] = "eth1"
    r.agent.trigger("udev", "add infiniband rxe0")
    await r.idle()
    assert host.links == {"rxe0": "eth1"}  # not deleted as if it were rdmad's
    await r.stop()
