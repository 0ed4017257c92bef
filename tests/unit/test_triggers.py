"""Triggers and batches: what a pass learns about the events it answers."""

from __future__ import annotations

import asyncio

from rdmad.triggers import LAG, MAX_LINK_NEWS, MAX_LINKS_HEARD, VERBS_LAG, Trigger, TriggerQueue
from tests.support.fakeclock import FakeClock


def test_batch_is_narrow_only_when_every_trigger_is() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("netlink", "add veth0", narrow=True, touches=frozenset({"veth0", "ifindex:7"})))
    q.put(Trigger("udev", "add net veth1", narrow=True, touches=frozenset({"ifindex:8"})))
    q.put(Trigger("udev", "remove infiniband rxe0", narrow=True, rdma=True))
    b = q.take()
    assert b is not None and b.narrow and b.rdma
    q.put(Trigger("netlink", "add veth2", narrow=True, touches=frozenset({"ifindex:9"})))
    q.put(Trigger("udev", "add pci 0000:00:03.0"))
    b = q.take()
    assert b is not None and not b.narrow


def test_urgent_is_kept_by_the_batch() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("udev", "add pci"))
    q.put(Trigger("followup", "verify", urgent=True))
    b = q.take()
    assert b is not None and b.urgent and not b.narrow


def news(q: TriggerQueue) -> dict[int, bytes | None] | None:
    b = q.take()
    assert b is not None, "a batch was pending"
    return b.link_news()


def test_link_news_keep_the_latest_per_link_in_order() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("netlink", "add a", narrow=True, link=(7, b"a1")))
    q.put(Trigger("netlink", "add b", narrow=True, link=(8, b"b1")))
    q.put(Trigger("netlink", "change a", narrow=True, link=(7, b"a2")))
    q.put(Trigger("netlink", "del b", narrow=True, link=(8, None)))
    q.put(Trigger("uevent", "remove rxe0", narrow=True, rdma=True))  # changes no netdev
    got = news(q)
    assert got == {7: b"a2", 8: None} and list(got) == [7, 8]
    assert q.take() is None  # taken: nothing pending
    q.put(Trigger("drift", "timer"))  # not narrow: the pass reads everything anyway
    assert news(q) == {}


def test_a_netdev_event_without_news_or_too_many_links_asks_for_a_read() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("netlink", "add a", narrow=True, link=(7, b"a1")))
    q.put(Trigger("udev", "add net a", narrow=True))
    assert news(q) is None
    for i in range(MAX_LINK_NEWS):
        q.put(Trigger("netlink", f"add {i}", narrow=True, link=(i, b"x")))
    q.put(
        Trigger(
            "netlink", f"change {MAX_LINK_NEWS - 1}", narrow=True, link=(MAX_LINK_NEWS - 1, b"y")
        )
    )
    b = q.take()
    assert b is not None and b.link_news() is not None and len(b.links) == MAX_LINK_NEWS
    for i in range(MAX_LINK_NEWS + 1):
        q.put(Trigger("netlink", f"add {i}", narrow=True, link=(i, b"x")))
    b = q.take()
    assert b is not None and b.link_news() is None and not b.links  # bounded: nothing kept


def test_a_batch_absorbs_a_later_one() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("netlink", "add a", narrow=True, link=(7, b"a1"), touches=frozenset({"a"})))
    first = q.take()
    q.put(Trigger("netlink", "change a", narrow=True, link=(7, b"a2")))
    q.put(Trigger("uevent", "remove rxe0", narrow=True, rdma=True, stale=True,
                  touches=frozenset({"rxe0"})))  # fmt: skip
    q.put(Trigger("netlink", "add b", narrow=True, link=(8, b"b1")))
    later = q.take()
    assert first is not None and later is not None
    first.absorb(later)
    assert first.count == 4 and first.through == 4 and first.rdma and first.narrow
    assert first.link_news() == {7: b"a2", 8: b"b1"}
    assert first.makes_stale(frozenset({"rxe0"})) and not first.makes_stale(frozenset({"a"}))
    assert first.describe() == "netlink x3, uevent"
    q.put(Trigger("udev", "add net c", narrow=True))
    unknown = q.take()
    assert unknown is not None
    first.absorb(unknown)
    assert first.link_news() is None


def test_news_only_means_nothing_to_read() -> None:
    q = TriggerQueue(FakeClock())
    q.put(Trigger("netlink", "add a", narrow=True, link=(7, b"a1")))
    assert q.pending is not None and q.pending.news_only
    q.put(Trigger("uevent", "remove rxe0", narrow=True, rdma=True))
    assert not q.pending.news_only  # RDMA devices are read
    q.take()
    q.put(Trigger("uevent", "remove rxe0", narrow=True, rdma=True))
    assert q.pending is not None and not q.pending.news_only  # no news at all


def test_what_reactions_key_on_and_what_disarms_them() -> None:
    q = TriggerQueue(FakeClock())
    q.put(
        Trigger(
            "netlink",
            "add benchv0",
            narrow=True,
            added=True,
            touches=frozenset({"benchv0", "ifindex:9"}),
        )
    )
    # udevd's copy of an RDMA removal does not count, the kernel's own does.
    q.put(
        Trigger(
            "udev",
            "remove infiniband rxe0",
            narrow=True,
            rdma=True,
            removed=True,
            touches=frozenset({"rxe0"}),
        )
    )
    q.put(
        Trigger(
            "udev",
            "remove infiniband rxe1",
            narrow=True,
            rdma=True,
            removed=True,
            announced=True,
            touches=frozenset({"rxe1"}),
        )
    )
    b = q.take()
    assert b is not None and b.added == {"benchv0"} and b.removed_rdma == {"rxe1"}
    assert b.may_react and not b.rdma_other
    q.put(
        Trigger(
            "udev",
            "add infiniband rxe2",
            narrow=True,
            rdma=True,
            announced=True,
            touches=frozenset({"rxe2"}),
        )
    )
    b = q.take()
    assert b is not None and b.rdma_other and not b.may_react  # nothing awaited in it
    q.put(Trigger("netlink", "add x", narrow=True, added=True, touches=frozenset({"x"})))
    q.put(Trigger("netlink", "resync", stale=True))  # events were lost
    b = q.take()
    assert b is not None and not b.may_react


VERBS_REMOVED = Trigger(
    "udev",
    "remove infiniband_verbs uverbs0",
    narrow=True,
    rdma=True,
    removed=True,
    lag=VERBS_LAG,
)


async def test_a_lagging_trigger_waits_for_what_follows_it_or_for_its_lag() -> None:
    clock = FakeClock()
    q = TriggerQueue(clock)
    q.put(VERBS_REMOVED)
    waiting = asyncio.ensure_future(q.wait())
    await asyncio.sleep(0)
    assert not waiting.done()  # no pass of its own at the leading edge
    q.put(Trigger("udev", "remove infiniband rxe0", narrow=True, rdma=True, removed=True))
    await asyncio.sleep(0)
    assert waiting.done() and waiting.result()  # what follows wakes the agent: one batch
    b = q.take()
    assert b is not None and b.count == 2 and not b.lagging
    q.put(VERBS_REMOVED)
    waiting = asyncio.ensure_future(q.wait())
    await asyncio.sleep(0)
    # Longer than the netdevs' lag: the RDMA device's own removal comes only once
    # every client of it let go (0.1 s was too short under emulation).
    clock.advance(LAG * 2)
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(VERBS_LAG)
    await asyncio.sleep(0)
    assert waiting.done() and waiting.result()  # alone, it is answered VERBS_LAG after it came


async def test_a_lag_ends_by_its_own_batch_s_timer_not_an_earlier_batch_s() -> None:
    clock = FakeClock()
    q = TriggerQueue(clock)
    q.put(VERBS_REMOVED)
    q.put(Trigger("udev", "remove infiniband rxe0", narrow=True, rdma=True, removed=True))
    assert q.take() is not None  # the first removal, answered at once
    clock.advance(VERBS_LAG / 2)
    q.put(VERBS_REMOVED)  # the next removal, half a lag later
    waiting = asyncio.ensure_future(q.wait())
    await asyncio.sleep(0)
    clock.advance(VERBS_LAG / 2)  # when the first batch's lag would have ended
    await asyncio.sleep(0)
    assert not waiting.done()  # still waiting for its own RDMA device's removal
    clock.advance(VERBS_LAG / 2)
    await asyncio.sleep(0)
    assert waiting.done() and waiting.result()
    assert clock.pending() == []


async def test_a_batch_of_lagging_triggers_waits_for_the_first_lag_to_end() -> None:
    clock = FakeClock()
    q = TriggerQueue(clock)
    q.put(VERBS_REMOVED)
    clock.advance(0.01)
    netdev_at = clock.monotonic()
    q.awaited_netdevs = frozenset({"eth9"})
    q.put(Trigger("netlink", "add peer0", narrow=True, added=True, touches=frozenset({"peer0"})))
    batch = q.pending
    assert batch is not None and batch.lagging and batch.lag_until == netdev_at + LAG
    waiting = asyncio.ensure_future(q.wait())
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(LAG)
    await asyncio.sleep(0)
    assert waiting.done() and waiting.result()  # each waits at most its own lag


def test_a_new_netdev_lags_only_while_another_one_is_awaited() -> None:
    def news(name: str) -> Trigger:
        return Trigger("netlink", f"add {name}", narrow=True, added=True, touches=frozenset({name}))

    q = TriggerQueue(FakeClock())
    q.put(news("peer0"))
    b = q.take()
    assert b is not None and not b.lagging  # nothing awaited: a pass at once
    q.awaited_netdevs = frozenset({"eth9"})
    q.put(news("peer0"))
    assert q.pending is not None and q.pending.lagging  # the awaited one may be next
    q.put(news("eth9"))
    b = q.take()
    assert b is not None and not b.lagging and b.added == {"peer0", "eth9"}
    q.put(news("eth9"))
    assert q.pending is not None and not q.pending.lagging
    q.take()
    q.put(Trigger("netlink", "change peer0", narrow=True, touches=frozenset({"peer0"})))
    assert q.pending is not None and not q.pending.lagging  # only news of a new netdev


def test_a_later_report_of_a_removal_does_not_make_its_re_add_stale() -> None:
    q = TriggerQueue(FakeClock())
    q.put(
        Trigger(
            "udev",
            "remove infiniband rxe0",
            stale=True,
            narrow=True,
            rdma=True,
            removed=True,
            touches=frozenset({"rxe0"}),
        )
    )
    b = q.take()
    assert b is not None and b.rdma_gone == {"rxe0"} and not b.removed_rdma
    add = frozenset({"rxe0", "eth0"})
    assert b.makes_stale(add) and not b.makes_stale(add, recreates="rxe0")
    q.put(Trigger("netlink", "del eth0", stale=True, narrow=True, touches=frozenset({"eth0"})))
    b.absorb(q.take())  # type: ignore[arg-type]
    assert b.makes_stale(add, recreates="rxe0")  # its netdev went: stale all the same


# --- uevents that echo link news ------------------------------------------------------------


def link_news(index: int, *names: str, gone: bool = False) -> Trigger:
    touches = frozenset({*names, f"ifindex:{index}"})
    kind = "del" if gone else "add"
    return Trigger(
        "netlink",
        f"{kind} {names[0]}",
        narrow=True,
        touches=touches,
        link=(index, None if gone else b"msg"),
    )


def uevent(action: str, index: int, *names: str) -> Trigger:
    """udevd's copy of a netdev's uevent, as daemon._udev_triggers makes it."""
    return Trigger(
        "udev",
        f"{action} net {names[0]}",
        narrow=True,
        stale=action in ("move", "remove"),
        touches=frozenset({*names, f"ifindex:{index}"}),
        removed=action == "remove",
        echo=(index, action != "remove"),
    )


def test_a_uevent_that_echoes_link_news_is_dropped() -> None:
    q = TriggerQueue(FakeClock())
    q.put(link_news(7, "veth0"))
    assert q.take() is not None  # the pass for the news ran
    # udevd's copy, seconds later: nothing new, no pass.
    q.put(uevent("add", 7, "veth0"))
    assert q.pending is None and q.echoes == 1 and q.total == 1
    assert q.by_source["udev"] == 1  # heard all the same
    q.put(link_news(7, "veth0", gone=True))
    q.take()
    q.put(uevent("remove", 7, "veth0"))
    assert q.pending is None and q.echoes == 2


def test_a_uevent_of_an_add_after_the_news_of_its_removal_is_dropped() -> None:
    """Behind a storm on a slow node udevd's copy of an add arrives after the link was
    deleted: the news told both already. Each used to start a pass of its own (34 of 59
    passes in a lab storm of 1,000 netdev events)."""
    q = TriggerQueue(FakeClock())
    q.put(link_news(7, "veth0"))
    q.put(link_news(7, "veth0", gone=True))
    q.take()
    q.put(uevent("add", 7, "veth0"))
    q.put(uevent("remove", 7, "veth0"))
    assert q.pending is None and q.echoes == 2
    q.put(uevent("add", 7, "other"))  # a name the news never carried: queued
    assert q.pending is not None and q.echoes == 2


def test_a_rename_heard_as_news_makes_both_names_the_links() -> None:
    q = TriggerQueue(FakeClock())
    q.put(link_news(7, "eth1"))
    q.put(link_news(7, "enp1s0v0", "eth1"))  # udevd renamed it: news with both names
    q.take()
    q.put(uevent("move", 7, "enp1s0v0", "eth1"))
    q.put(uevent("add", 7, "enp1s0v0"))
    assert q.pending is None and q.echoes == 2


def test_a_uevent_that_tells_more_than_the_news_is_queued() -> None:
    q = TriggerQueue(FakeClock())
    q.put(uevent("add", 7, "veth0"))  # before any news of the link: queued
    assert q.pending is not None and q.pending.links_unknown
    q.take()
    q.put(link_news(7, "veth0"))
    q.take()
    q.put(uevent("remove", 7, "veth0"))  # the news said present: queued
    q.take()
    q.put(uevent("move", 7, "other", "veth0"))  # a name the news never carried: queued
    q.take()
    q.put(uevent("add", 8, "veth1"))  # another link: queued
    assert q.take() is not None and q.echoes == 0
    # Re-added under the same index after its removal: the old names are forgotten.
    q.put(link_news(9, "a"))
    q.put(link_news(9, "a", gone=True))
    q.put(link_news(9, "b"))
    q.take()
    q.put(uevent("add", 9, "a"))
    assert q.pending is not None and q.echoes == 0


def test_lost_link_news_make_no_uevent_an_echo() -> None:
    q = TriggerQueue(FakeClock())
    q.put(link_news(7, "veth0"))
    q.put(Trigger("netlink", "resync", stale=True))  # the news socket overflowed
    q.take()
    q.put(uevent("add", 7, "veth0"))
    assert q.pending is not None and q.echoes == 0


def test_the_links_heard_are_bounded() -> None:
    q = TriggerQueue(FakeClock())
    for i in range(1, MAX_LINKS_HEARD + 2):
        q.put(link_news(i, f"v{i}"))
    q.take()
    q.put(uevent("add", 1, "v1"))  # the oldest was forgotten: queued
    assert q.pending is not None
    q.take()
    q.put(uevent("add", MAX_LINKS_HEARD + 1, f"v{MAX_LINKS_HEARD + 1}"))
    assert q.pending is None and q.echoes == 1
