"""rdmad's rtnetlink layer (rtnetlink, linkevents) against this machine's real kernel,
inside throwaway network namespaces.

Needs root. Every namespace is created by a fixture and deleted even when a test fails;
every wait is bounded by a deadline.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
from collections.abc import Callable, Iterator

import pytest

from rdmad import daemon
from rdmad.kernel.apply.observe import observe_changed
from rdmad.kernel.errors import KernelError
from rdmad.kernel.events.linkevents import LinkEvent, LinkEventStream
from rdmad.kernel.netlink.rtnetlink import RtNetlink
from rdmad.kernel.netlink.rtnl_codec import parse_link
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import NetdevObserved, Observed, VfChange, VfSettings
from rdmad.triggers import TriggerQueue
from tests.support.fakeclock import FakeClock
from tests.support.netns import owned_netns
from tests.support.records import replace

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces"),
]

DEADLINE = 10.0


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def ifindex(ns: str, name: str) -> int:
    return int(json.loads(ip("-n", ns, "-j", "link", "show", "dev", name))[0]["ifindex"])


@pytest.fixture
def netns2() -> Iterator[str]:
    """A second namespace beside conftest's ``netns``."""
    with owned_netns() as name:
        yield name


async def collect_until(
    stream: LinkEventStream, done: Callable[[LinkEvent], bool], limit: int = 10_000
) -> list[LinkEvent]:
    """Events up to and including the first that satisfies ``done``; bounded in time and count."""
    seen: list[LinkEvent] = []

    async def run() -> None:
        async for event in stream:
            seen.append(event)
            if done(event) or len(seen) >= limit:
                return

    await asyncio.wait_for(run(), DEADLINE)
    return seen


async def test_links_report_veth_with_mac_ifindex_and_up(netns: str) -> None:
    ip("-n", netns, "link", "add", "rdv0", "address", "02:00:00:00:aa:01", "type", "veth",
       "peer", "name", "rdv1", "address", "02:00:00:00:aa:02")  # fmt: skip
    ip("-n", netns, "link", "set", "rdv0", "up")
    async with RtNetlink(netns) as rt:
        links = {link.name: link for link in await rt.links()}
    assert {"lo", "rdv0", "rdv1"} <= set(links)
    v0, v1 = links["rdv0"], links["rdv1"]
    assert (v0.mac, v1.mac) == ("02:00:00:00:aa:01", "02:00:00:00:aa:02")
    assert (v0.ifindex, v1.ifindex) == (ifindex(netns, "rdv0"), ifindex(netns, "rdv1"))
    assert v0.up and not v1.up
    assert v0.kind == "veth"
    assert v0.num_vf is None and v0.vfs == {} and v0.vfs_complete
    assert v0.operstate in ("lowerlayerdown", "down")  # its peer is down


async def test_set_up(netns: str) -> None:
    ip("-n", netns, "link", "add", "rdv0", "type", "veth", "peer", "name", "rdv1")
    async with RtNetlink(netns) as rt:
        await rt.set_up("rdv0")
        await rt.set_up(ifindex(netns, "rdv1"))
        links = {link.name: link for link in await rt.links()}
    assert links["rdv0"].up and links["rdv1"].up


async def test_set_up_missing_link_names_it(netns: str) -> None:
    async with RtNetlink(netns) as rt:
        with pytest.raises(KernelError) as info:
            await rt.set_up("nosuch0")
    assert info.value.errno == errno.ENODEV
    assert "set nosuch0 up" in str(info.value) and "ENODEV" in str(info.value)


async def test_events_add_rename_delete_by_ifindex(netns: str) -> None:
    rt = RtNetlink(netns)
    async with LinkEventStream(rt.netns) as stream:
        ip("-n", netns, "link", "add", "rdv0", "type", "veth", "peer", "name", "rdv1")
        index = ifindex(netns, "rdv0")
        ip("-n", netns, "link", "set", "rdv0", "name", "rdrenamed")
        ip("-n", netns, "link", "del", "rdrenamed")
        events = await collect_until(stream, lambda e: e.kind == "del" and e.ifindex == index)
    mine = [e for e in events if e.ifindex == index]
    assert mine[0].kind == "add" and mine[0].name == "rdv0"
    renames = [e for e in mine if e.old_name == "rdv0"]
    assert renames and renames[0].kind == "change" and renames[0].name == "rdrenamed"
    assert mine[-1].kind == "del" and mine[-1].name == "rdrenamed"
    assert not [e for e in events if e.kind == "resync"]


async def test_address_changes_are_heard_per_ifindex_and_queued_only_when_watched(
    netns: str,
) -> None:
    # An rxe link's GIDs follow its netdev's addresses; nothing else tells rdmad they
    # changed. The link event socket hears IPv4 and IPv6 address adds and removals.
    async with LinkEventStream(netns) as stream:
        ip("-n", netns, "link", "add", "rdv0", "type", "veth", "peer", "name", "rdv1")
        index = ifindex(netns, "rdv0")
        ip("-n", netns, "addr", "add", "10.99.0.1/32", "dev", "rdv0")
        added = await collect_until(stream, lambda e: e.kind == "addr" and e.ifindex == index)
        ip("-n", netns, "addr", "add", "fd99::1/128", "dev", "rdv0", "nodad")
        v6 = await collect_until(stream, lambda e: e.kind == "addr" and e.ifindex == index)
        ip("-n", netns, "addr", "del", "10.99.0.1/32", "dev", "rdv0")
        gone = await collect_until(stream, lambda e: e.kind == "addr" and e.ifindex == index)
        triggers = daemon._link_triggers(stream)
        queue = TriggerQueue(FakeClock())
        ip("-n", netns, "addr", "add", "10.99.0.2/32", "dev", "rdv0")
        unwatched = await asyncio.wait_for(anext(triggers), DEADLINE)
        queue.put(unwatched)
        assert queue.pending is None  # nobody waits for rdv0's addresses
        queue.address_watch = frozenset({index})
        ip("-n", netns, "addr", "del", "10.99.0.2/32", "dev", "rdv0")
        watched = await asyncio.wait_for(anext(triggers), DEADLINE)
        queue.put(watched)
    assert added[-1].name == "rdv0"  # as the stream last heard the link named
    assert v6[-1].kind == gone[-1].kind == "addr"
    assert (unwatched.address, watched.address) == (index, index)
    batch = queue.take()
    assert batch is not None and batch.count == 1 and batch.narrow
    assert batch.link_news() is None  # the netdevs are read again: no news of them


async def test_link_news_bring_a_snapshot_to_what_a_dump_lists(netns: str, netns2: str) -> None:
    # The event path's narrow pass applies a batch's link news (the daemon's own triggers
    # from this stream) to the last snapshot instead of dumping the links: after adds,
    # renames, address and state changes, deletions and a move away, the two must agree.
    ip("-n", netns, "link", "add", "rdold0", "type", "veth", "peer", "name", "rdold1")
    ip("-n", netns, "link", "add", "rdgone", "type", "veth", "peer", "name", "rdgone1")
    rt = RtNetlink(netns)
    async with LinkEventStream(rt.netns) as stream:
        before = await rt.links(vfs=False)
        last = replace(
            Observed(),
            netdevs=tuple(NetdevObserved(k.name, k.ifindex, k.mac, k.perm_mac, None, k.up)
                          for k in before),
        )  # fmt: skip
        commands = [
            "link add rdv0 type veth peer name rdv1",
            "link set rdv0 name rdrenamed",
            "link set rdrenamed address 02:00:00:00:0a:0b",
            "link set rdrenamed up",
            "link set rdold0 up",
            "link del rdgone",
            "link add rdd0 type veth peer name rdd1",
            "link set rdd0 netns " + netns2,
            "link add rdend type veth peer name rdend1",  # the kernel announces rdend last
        ]
        subprocess.run(
            ["ip", "-n", netns, "-batch", "-"], input="\n".join(commands) + "\n", text=True,
            check=True,
        )  # fmt: skip
        end = ifindex(netns, "rdend")
        queue = TriggerQueue(FakeClock())
        triggers = daemon._link_triggers(stream)

        async def take_all() -> None:
            async for trigger in triggers:
                queue.put(trigger)
                if trigger.link is not None and trigger.link[0] == end:
                    return

        await asyncio.wait_for(take_all(), DEADLINE)
        batch = queue.take()
        assert batch is not None and batch.narrow
        news = batch.link_news()
        assert news is not None
        dump = await rt.links(vfs=False)
    changed = [parse_link(m) for m in news.values() if m is not None]
    gone = {i for i, m in news.items() if m is None}
    sysfs = Sysfs("/nonexistent")  # only virtual links here: nothing is read from sysfs
    from_news = observe_changed(sysfs, last, changed, None, gone=gone)
    from_dump = observe_changed(sysfs, last, dump, None)
    assert from_news is not None and from_dump is not None
    assert sorted(from_news.netdevs, key=lambda n: n.ifindex) == sorted(
        from_dump.netdevs, key=lambda n: n.ifindex
    )
    names = {n.name for n in from_news.netdevs}
    assert {"rdrenamed", "rdv1", "rdold0", "rdend"} <= names
    assert not names & {"rdv0", "rdgone", "rdgone1", "rdd0"}
    renamed = next(n for n in from_news.netdevs if n.name == "rdrenamed")
    assert renamed.mac == "02:00:00:00:0a:0b" and renamed.up


async def test_events_move_to_another_netns(netns: str, netns2: str) -> None:
    ip("-n", netns, "link", "add", "rdv0", "type", "veth", "peer", "name", "rdv1")
    old_index = ifindex(netns, "rdv0")
    async with LinkEventStream(netns) as here, LinkEventStream(netns2) as there:
        ip("-n", netns, "link", "set", "rdv0", "netns", netns2)
        new_index = ifindex(netns2, "rdv0")
        gone = await collect_until(here, lambda e: e.kind == "del" and e.ifindex == old_index)
        came = await collect_until(there, lambda e: e.kind == "add" and e.ifindex == new_index)
    assert gone[-1].name == "rdv0"
    assert came[-1].name == "rdv0"


async def test_enobufs_gives_resync_and_stream_keeps_working(netns: str) -> None:
    # A tiny receive buffer and nobody reading while ~100 links come and go: the kernel
    # must drop notifications and report ENOBUFS.
    rt = RtNetlink(netns)
    async with LinkEventStream(rt.netns, rcvbuf=4096) as stream:
        batch = "".join(f"link add rdf{i} type veth peer name rdg{i}\n" for i in range(50))
        batch += "".join(f"link del rdf{i}\n" for i in range(50))
        subprocess.run(["ip", "-n", netns, "-batch", "-"], input=batch, text=True, check=True)
        events = await collect_until(stream, lambda e: e.kind == "resync")
        assert events[-1].kind == "resync"
        assert stream.overflows >= 1
        # After the overflow the stream still delivers, with the right ifindex.
        ip("-n", netns, "link", "add", "rdafter0", "type", "veth", "peer", "name", "rdafter1")
        index = ifindex(netns, "rdafter0")
        later = await collect_until(stream, lambda e: e.ifindex == index and e.kind == "add")
    assert later[-1].name == "rdafter0"


async def test_set_vf_settings_on_a_link_without_vfs_names_vf_attr_and_errno(
    netns: str,
) -> None:
    ip("-n", netns, "link", "add", "rdv0", "type", "veth", "peer", "name", "rdv1")
    changes = [
        VfChange(0, "mac", None, "02:00:00:00:00:10"),
        VfChange(0, "vlan", None, 100),
        VfChange(0, "vlan_proto", None, "802.1ad"),
        VfChange(3, "link_state", "auto", "disable"),
        VfChange(3, "max_tx_rate", 0, 1000),
        VfChange(3, "spoofchk", None, True),
    ]
    async with RtNetlink(netns) as rt:
        results = await rt.set_vf_settings("rdv0", changes, {3: VfSettings(min_tx_rate=10)})
    assert [r.change for r in results] == changes
    for r in results:
        assert not r.ok and r.error is not None
        assert r.error.errno == errno.EOPNOTSUPP
        text = str(r.error)
        assert f"set vf {r.change.vf} {r.change.attr} on rdv0" in text, text
        assert "EOPNOTSUPP" in text and "not supported" in text
    proto = next(r for r in results if r.change.attr == "vlan_proto")
    assert proto.error is not None and "vlan 100 qos 0 proto 802.1ad" in proto.error.detail
    rate = next(r for r in results if r.change.attr == "max_tx_rate")
    assert rate.error is not None and "rate 10-1000" in rate.error.detail  # min from current


async def test_set_vf_settings_invalid_value_is_not_sent(netns: str) -> None:
    ip("-n", netns, "link", "add", "rdv0", "type", "veth", "peer", "name", "rdv1")
    async with RtNetlink(netns) as rt:
        [bad] = await rt.set_vf_settings("rdv0", [VfChange(1, "link_state", None, "on")], {})
    assert bad.error is not None and bad.error.errno is None
    assert str(bad.error) == "set vf 1 link_state on rdv0: cannot set link_state to 'on'"


async def test_set_vf_settings_missing_link(netns: str) -> None:
    async with RtNetlink(netns) as rt:
        [res] = await rt.set_vf_settings("nosuch0", [VfChange(0, "trust", None, True)], {})
    assert res.error is not None and res.error.errno == errno.ENODEV


async def test_links_lists_every_link_of_a_large_namespace(netns: str) -> None:
    # A multi-part dump: every link comes back, each once (its cost is bench/'s business).
    batch = "".join(f"link add rdm{i} type veth peer name rdn{i}\n" for i in range(100))
    subprocess.run(["ip", "-n", netns, "-batch", "-"], input=batch, text=True, check=True)
    async with RtNetlink(netns) as rt:
        links = await rt.links()
    names = [link.name for link in links]
    assert len(names) == 201 and len(set(names)) == 201
    assert {f"rdm{i}" for i in range(100)} | {f"rdn{i}" for i in range(100)} <= set(names)


async def test_pf_addressed_by_ifindex_and_read_one_link(netns: str) -> None:
    ip("-n", netns, "link", "add", "rdv0", "type", "veth", "peer", "name", "rdv1")
    async with RtNetlink(netns) as rt:
        [veth] = [link for link in await rt.links() if link.name == "rdv0"]
        assert (await rt.link(veth.ifindex)).name == "rdv0"
        assert (await rt.link("rdv0")).ifindex == veth.ifindex
        [res] = await rt.set_vf_settings(veth.ifindex, [VfChange(0, "trust", None, True)], {})
        with pytest.raises(KernelError) as missing:
            await rt.link(veth.ifindex + 1000)
    assert res.error is not None and res.error.errno == errno.EOPNOTSUPP
    assert f"set vf 0 trust on ifindex {veth.ifindex}" in str(res.error)
    assert missing.value.errno == errno.ENODEV
