"""Restored means working: an rxe link present as declared but unable to carry traffic
(its port not ACTIVE, no GID made from an IP address) is not converged, and says why."""

from __future__ import annotations

import pytest

from rdmad.model import (
    Action,
    Desired,
    ModulesObserved,
    NetdevObserved,
    NotServing,
    Observed,
    PlanState,
    RdmaLinkObserved,
)
from rdmad.model.status import NodeState, ObjectState, node_verdict, summarize
from rdmad.model.validation import validate
from rdmad.reconcile import plan
from rdmad.reconcile.detail import describe
from rdmad.reconcile.rxe import GID_RECHECK
from rdmad.triggers import Trigger, TriggerQueue
from tests.support.fakeclock import FakeClock

LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:3456"  # the default GID, from the MAC
IPV4 = "0000:0000:0000:0000:0000:ffff:0a4d:0001"  # 10.77.0.1
IPV6 = "fd00:0000:0000:0000:0000:0000:0000:0001"
DESIRED = validate(Desired, {"rxe": [{"name": "rxe0", "netdev": {"name": "eth0"}}]})


def observed(link: RdmaLinkObserved) -> Observed:
    return Observed(
        netdevs=(NetdevObserved("eth0", 2, "52:54:00:12:34:56", None, None, True),),
        rdma_links=(link,),
        modules=ModulesObserved(frozenset({"rdma_rxe"})),
    )


def rxe0(port_state: str | None = "ACTIVE", gids: tuple[str, ...] | None = ()) -> RdmaLinkObserved:
    return RdmaLinkObserved(
        "rxe0", "rxe", "eth0", netdev_ifindex=2, port_state=port_state, gids=gids
    )


def plan_for(link: RdmaLinkObserved) -> list[Action]:
    return list(plan(DESIRED, observed(link), PlanState(frozenset({"rxe0"}))))


@pytest.mark.parametrize("gids", [(LINK_LOCAL, IPV4), (IPV4,), (LINK_LOCAL, IPV6)])
def test_active_with_a_gid_of_an_address_serves(gids: tuple[str, ...]) -> None:
    assert plan_for(rxe0(gids=gids)) == []


@pytest.mark.parametrize("state", ["DOWN", "INIT", "ARMED"])
def test_a_port_not_active_cannot_serve(state: str) -> None:
    [a] = plan_for(rxe0(port_state=state, gids=(LINK_LOCAL, IPV4)))
    assert isinstance(a, NotServing)
    assert a.reason == (
        f"rxe rxe0 on eth0 cannot carry traffic: its port is {state} "
        "(it turns ACTIVE when eth0 is up with a carrier)"
    )
    assert a.recheck == 0  # the netdev's own events say when that changes


@pytest.mark.parametrize(
    "gids", [(), (LINK_LOCAL,), (LINK_LOCAL, "fe80:0000:0000:0000:0000:0000:0000:0002")]
)
def test_no_gid_of_an_address_cannot_serve_and_is_looked_at_again(gids: tuple[str, ...]) -> None:
    [a] = plan_for(rxe0(gids=gids))
    assert isinstance(a, NotServing)
    assert "has no GID made from an IP address of eth0" in a.reason
    assert "give eth0 an IPv4 or IPv6 address" in a.reason
    # GIDs come from a kernel work queue with no event: one look again, and the
    # netdev's address changes are listened to.
    assert (a.recheck, a.netdev_ifindex) == (GID_RECHECK, 2)


def test_what_was_not_read_says_nothing() -> None:
    # The sysfs fallback (no RDMA netlink) reads neither: unknown is no finding.
    assert plan_for(rxe0(port_state=None, gids=None)) == []


def test_not_serving_is_pending_and_the_node_not_converged() -> None:
    actions = plan_for(rxe0(port_state="DOWN"))
    [status] = summarize(["rxe rxe0"], actions)
    assert status.state is ObjectState.PENDING
    assert "its port is DOWN" in status.message
    verdict = node_verdict([status], passes=1)
    assert verdict.state is NodeState.NOT_CONVERGED
    assert "rxe rxe0: rxe rxe0 on eth0 cannot carry traffic" in verdict.reason


def test_detail_says_present_as_declared_but_not_serving() -> None:
    link = rxe0(gids=(LINK_LOCAL,))
    details = describe(DESIRED, observed(link), plan_for(link))
    doc = details["rxe rxe0"].to_json()
    netdev, serving = doc["attributes"]
    assert (netdev["name"], netdev["state"]) == ("netdev", "converged")
    assert (serving["name"], serving["desired"], serving["observed"]) == ("serving", True, False)
    assert serving["state"] == "pending" and "no GID" in serving["reason"]
    assert doc["observed"]["port_state"] == "ACTIVE"
    assert doc["observed"]["gids"] == [LINK_LOCAL]


def test_detail_of_a_serving_link_is_converged_throughout() -> None:
    link = rxe0(gids=(LINK_LOCAL, IPV4))
    doc = describe(DESIRED, observed(link), [])["rxe rxe0"].to_json()
    assert [(a["name"], a["state"]) for a in doc["attributes"]] == [
        ("netdev", "converged"),
        ("serving", "converged"),
    ]


# --- address events: only for netdevs whose GIDs are awaited ----------------------------


def test_address_changes_start_a_pass_only_when_watched() -> None:
    queue = TriggerQueue(FakeClock())
    queue.put(Trigger("netlink", "address of eth0", narrow=True, address=2))
    assert queue.pending is None  # nobody waits for eth0's addresses: dropped
    queue.address_watch = frozenset({2})
    queue.put(Trigger("netlink", "address of eth1", narrow=True, address=3))
    assert queue.pending is None
    queue.put(Trigger("netlink", "address of eth0", narrow=True, address=2))
    batch = queue.take()
    assert batch is not None and batch.count == 1
    assert batch.link_news() is None  # no news of the links: they are read again


def test_an_address_change_is_not_lost_news() -> None:
    """A netlink trigger without link news is a resync that forgets what news said;
    an address change is not one (udevd's echoes of that news stay recognized)."""
    queue = TriggerQueue(FakeClock())
    queue.address_watch = frozenset({2})
    queue.put(
        Trigger("netlink", "add eth9", narrow=True, touches=frozenset({"eth9"}), link=(9, b""))
    )
    queue.put(Trigger("netlink", "address of eth0", narrow=True, address=2))
    echo = Trigger("udev", "net add eth9", touches=frozenset({"eth9"}), echo=(9, True))
    before = queue.echoes
    queue.put(echo)
    assert queue.echoes == before + 1
