"""plan() for [rdma] netns_mode: the modprobe.d option first, the live mode only while no
other network namespace is known to exist (table tests), and what status says."""

from __future__ import annotations

import pytest

from rdmad.model import (
    Blocked,
    Desired,
    ModulesObserved,
    Note,
    ObjectState,
    Observed,
    PauseObserved,
    PlanState,
    RdmaSysObserved,
    SetRdmaNetnsMode,
    SyncIbCoreOptions,
    Waiting,
    summarize,
)
from rdmad.model.validation import SpecError, validate
from rdmad.reconcile import declared_objects, plan

CONTAINER = "pid 4121 (pause)"


def desired(mode: str | None) -> Desired:
    return validate(Desired, {"rdma": {"netns_mode": mode}} if mode else {})


def run(mode: str | None, seen: RdmaSysObserved | None, **kw: object) -> list[object]:
    observed = Observed(modules=ModulesObserved(frozenset({"ib_core"})), rdma_sys=seen, **kw)  # type: ignore[arg-type]
    return list(plan(desired(mode), observed, PlanState()))


def sys(live: str | None, boot: str | None = None, **kw: object) -> RdmaSysObserved:
    return RdmaSysObserved(netns_mode=live, boot_mode=boot, boot_file=boot is not None, **kw)  # type: ignore[arg-type]


OPTION = SyncIbCoreOptions


@pytest.mark.parametrize(
    ("mode", "seen", "expected"),
    [
        # not declared: nothing, and rdmad's own option file (only) is removed
        (None, sys("shared"), []),
        (None, sys("exclusive"), []),
        (None, sys("shared", "exclusive"), [OPTION]),
        # declared: the option first, then the live mode
        ("exclusive", sys("shared"), [OPTION, SetRdmaNetnsMode]),
        ("exclusive", sys("exclusive"), [OPTION]),
        ("exclusive", sys("exclusive", "exclusive"), []),
        ("shared", sys("exclusive", "exclusive"), [OPTION, SetRdmaNetnsMode]),
        ("exclusive", sys("shared", "exclusive", namespaces=()), [SetRdmaNetnsMode]),
        # ib_core not loaded: it loads in the option's mode; nothing pending
        ("exclusive", sys(None), [OPTION, Note]),
        ("exclusive", sys(None, "exclusive"), [Note]),
        # namespaces in the way: blocked; none seen (some unreadable): the kernel decides
        ("exclusive", sys("shared", "exclusive", namespaces=(CONTAINER,)), [Blocked]),
        (
            "exclusive",
            sys("shared", "exclusive", namespaces_unknown="2 unreadable"),
            [SetRdmaNetnsMode],
        ),
        # an edited option file is rewritten
        ("exclusive", sys("exclusive", "exclusive", boot_file_current=False), [OPTION]),
        # a snapshot without the RDMA subsystem read: nothing planned
        ("exclusive", None, []),
    ],
)
def test_plan(mode: str | None, seen: RdmaSysObserved | None, expected: list[type]) -> None:
    assert [type(a) for a in run(mode, seen)] == expected


def test_option_and_set_carry_old_and_new() -> None:
    option, change = run("exclusive", sys("shared", "shared"))
    assert isinstance(option, SyncIbCoreOptions) and (option.old, option.mode) == (
        "shared",
        "exclusive",
    )
    assert isinstance(change, SetRdmaNetnsMode) and (change.old, change.new) == (
        "shared",
        "exclusive",
    )
    assert change.describe() == "rdma system set netns exclusive (was shared)"
    assert option.obj == change.obj == "rdma"


def test_blocked_names_the_namespaces_and_when_it_takes_effect() -> None:
    seen = sys("shared", "exclusive", namespaces=("'blue' (ip netns)", CONTAINER))
    (blocked,) = run("exclusive", seen)
    assert isinstance(blocked, Blocked)
    assert "2 exist: 'blue' (ip netns); pid 4121 (pause)" in blocked.reason
    assert "next boot or ib_core reload" in blocked.reason
    status = summarize(declared_objects(desired("exclusive")), [blocked])
    assert [(s.obj, s.state) for s in status] == [("rdma", ObjectState.BLOCKED)]


def test_what_could_not_be_read_is_said_beside_what_blocks() -> None:
    """Unread namespaces name nothing and decide nothing: the kernel refuses atomically
    (EBUSY), so a write it refuses costs a failed write, never a VF or a link."""
    unread = "the network namespace of 3 processes is not readable"
    seen = sys("shared", "exclusive", namespaces=(CONTAINER,), namespaces_unknown=unread)
    (blocked,) = run("exclusive", seen)
    assert isinstance(blocked, Blocked) and f"1 exist: {CONTAINER} ({unread})" in blocked.reason


def test_not_loaded_is_converged() -> None:
    actions = run("exclusive", sys(None, "exclusive"))
    status = summarize(declared_objects(desired("exclusive")), actions)  # type: ignore[arg-type]
    assert [(s.obj, s.state) for s in status] == [("rdma", ObjectState.CONVERGED)]


def test_held_back_during_a_guarded_stop() -> None:
    """An RDMA netlink request would load ib_core again right after the stop removed it."""
    pause = PauseObserved(by="modprobe -r ib_core", reason="stop", since=0.0, until=1e12)
    actions = run("exclusive", sys("shared", "exclusive", namespaces=()), pause=pause)
    assert [type(a) for a in actions] == [Waiting]


def test_only_declared_when_set() -> None:
    assert "rdma" not in declared_objects(desired(None))
    assert "rdma" in declared_objects(desired("shared"))


def test_a_mode_of_another_name_is_a_config_error() -> None:
    with pytest.raises(SpecError) as info:
        validate(Desired, {"rdma": {"netns_mode": "private"}})
    assert "rdma.netns_mode" in str(info.value)


def test_status_detail_shows_live_next_load_and_what_blocks() -> None:
    from rdmad.reconcile.detail import describe

    seen = sys("shared", "exclusive", namespaces=(CONTAINER,))
    observed = Observed(rdma_sys=seen)
    actions = plan(desired("exclusive"), observed, PlanState())
    detail = describe(desired("exclusive"), observed, actions)["rdma"]
    assert detail.kind == "rdma"
    assert detail.observed["netns_mode"] == "shared"
    assert detail.observed["boot_netns_mode"] == "exclusive"
    assert detail.observed["namespaces"] == [CONTAINER]
    live, boot = detail.attributes
    assert (live.name, live.desired, live.observed, live.state) == (
        "netns_mode",
        "exclusive",
        "shared",
        ObjectState.BLOCKED,
    )
    assert (boot.name, boot.state) == ("boot_netns_mode", ObjectState.CONVERGED)
    # Not declared and nothing of rdmad's to remove: no object at all.
    assert "rdma" not in describe(desired(None), Observed(rdma_sys=sys("shared")), [])
