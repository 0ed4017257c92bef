"""Reactions: plan() asked ahead what one awaited event would add (pure)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rdmad.model import (
    AddRxe,
    Desired,
    ModulesObserved,
    NetdevObserved,
    Observed,
    PauseObserved,
    PlanState,
    RdmaLinkObserved,
)
from rdmad.model.validation import validate
from rdmad.reconcile import plan
from rdmad.reconcile.reactions import NONE, Reactions, anticipate
from tests.support.records import replace

RXE = ModulesObserved(frozenset({"rdma_rxe"}))


def declare(*rxe: tuple[str, dict[str, str]]) -> Desired:
    return validate(Desired, {"rxe": [{"name": n, "netdev": ref} for n, ref in rxe]})


def node(
    netdevs: tuple[str, ...] = (), links: dict[str, str] | None = None, **kw: object
) -> Observed:
    return Observed(
        netdevs=tuple(NetdevObserved(n, i + 1) for i, n in enumerate(netdevs)),
        rdma_links=tuple(RdmaLinkObserved(k, "rxe", v) for k, v in (links or {}).items()),
        modules=kw.pop("modules", RXE),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def armed(desired: Desired, observed: Observed, state: PlanState | None = None) -> Reactions:
    state = state or PlanState()
    return anticipate(desired, observed, state, plan, plan(desired, observed, state))


def test_a_link_waiting_for_its_netdev_is_added_when_a_netdev_of_that_name_comes() -> None:
    r = armed(declare(("rxe0", {"name": "eth9"})), node(("eth0",)))
    assert r.on_netdev == {
        "eth9": (AddRxe("rxe rxe0", "declared rxe link is missing", name="rxe0", netdev="eth9"),)
    }
    assert not r.on_rdma_removed
    assert r.due(["eth0", "eth9"], []) == [r.on_netdev["eth9"][0]]


def test_a_link_in_place_is_added_again_when_the_kernel_removes_it() -> None:
    r = armed(declare(("rxe0", {"name": "eth0"})), node(("eth0",), {"rxe0": "eth0"}))
    assert not r.on_netdev
    [action] = r.on_rdma_removed["rxe0"]
    assert isinstance(action, AddRxe) and (action.name, action.netdev) == ("rxe0", "eth0")
    assert r.due([], ["uverbs0"]) == []


def test_nothing_is_armed_where_plan_would_do_more_than_create_an_rxe_link() -> None:
    d = declare(("rxe0", {"name": "eth9"}))
    # rdma_rxe not loaded: the change would also load a module.
    assert armed(d, node(("eth0",), modules=ModulesObserved())) is NONE
    # A guarded stop in force: plan() stands back, so nothing is due either.
    pause = PauseObserved("rdmad-ctl pause (uid 0)", "maintenance", 0.0, 2e9)
    assert armed(d, node(("eth0",), pause=pause)) is NONE
    # No RDMA netlink: blocked whatever comes.
    assert armed(d, node(("eth0",), rdma_netlink=False)) is NONE
    # The link exists on another netdev (not rdmad's): blocked, not moved ahead of time.
    assert armed(d, node(("eth0",), {"rxe0": "eth0"})) is NONE
    # The netdev is there and the link is not: the pass itself adds it, nothing to await.
    assert armed(d, node(("eth9",))) is NONE


def test_only_netdevs_named_by_name_are_awaited() -> None:
    by_mac = declare(("rxe0", {"mac": "02:00:00:00:00:09"}))
    assert armed(by_mac, node(("eth0",))) is NONE


def test_two_links_on_one_netdev_are_armed_once() -> None:
    d = declare(("rxe0", {"name": "eth9"}), ("rxe1", {"name": "eth9"}))
    r = armed(d, node(("eth0",)))
    assert [a.name for a in r.on_netdev["eth9"]] == ["rxe0", "rxe1"]  # type: ignore[attr-defined]


NAMES = st.sampled_from(["eth0", "eth1", "eth9"])


@settings(max_examples=200, deadline=None)
@given(
    specs=st.lists(
        st.tuples(st.sampled_from(["rxe0", "rxe1", "rxe2"]), NAMES),
        max_size=3,
        unique_by=lambda t: t[0],
    ),
    netdevs=st.sets(NAMES),
    links=st.dictionaries(st.sampled_from(["rxe0", "rxe1", "rxe2"]), NAMES, max_size=3),
    managed=st.sets(st.sampled_from(["rxe0", "rxe1", "rxe2"])),
)
def test_what_is_armed_is_what_plan_does_once_the_event_came(
    specs: list[tuple[str, str]], netdevs: set[str], links: dict[str, str], managed: set[str]
) -> None:
    """Every armed action is in plan() of the snapshot the event makes, and is an rxe add."""
    d = declare(*((n, {"name": dev}) for n, dev in specs))
    observed = node(tuple(sorted(netdevs)), {k: v for k, v in links.items() if v in netdevs})
    state = PlanState(managed_rxe=frozenset(managed))
    r = armed(d, observed, state)
    for name, actions in r.on_netdev.items():
        came = replace(observed, netdevs=(*observed.netdevs, NetdevObserved(name, 99)))
        after = plan(d, came, state)
        assert all(isinstance(a, AddRxe) and a in after for a in actions)
    for name, actions in r.on_rdma_removed.items():
        gone = replace(observed, rdma_links=tuple(x for x in observed.rdma_links if x.name != name))
        after = plan(d, gone, state)
        assert all(isinstance(a, AddRxe) and a in after for a in actions)
