"""rdmad.kernel.events.uevents: the kernel's uevents read off the socket (root; a veth of
the test's).

The daemon reads RDMA devices this way (the lab's rxe tests show a deleted link put back
from it); here net events stand in, being the ones a test can make on this machine.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess

import pytest

from rdmad.kernel.events.udev import WANTED, UdevEvent
from rdmad.kernel.events.uevent_filter import SCAN, SCANS, attach_uevent_filter
from rdmad.kernel.events.uevents import NETLINK_KOBJECT_UEVENT, KernelUevents, parse_uevent
from rdmad.kernel.netlink.nlsock import open_netlink_socket

DEADLINE = 10.0
RDMA = {s: WANTED[s] for s in ("infiniband", "infiniband_verbs")}

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for veth and uevents")


def uevent(action: str, devpath: str, subsystem: str, *more: str) -> bytes:
    fields = [f"{action}@{devpath}", f"ACTION={action}", f"DEVPATH={devpath}"]
    fields += [f"SUBSYSTEM={subsystem}", *more, "SEQNUM=4242"]
    return b"".join(f.encode() + b"\0" for f in fields)


def test_an_rdma_device_removal_is_parsed() -> None:
    data = uevent("remove", "/devices/virtual/infiniband/rxe0", "infiniband", "NAME=rxe0")
    assert parse_uevent(data, RDMA) == UdevEvent(
        "remove", "infiniband", "rxe0", "/devices/virtual/infiniband/rxe0", source="kernel"
    )
    verbs = uevent("remove", "/devices/virtual/infiniband_verbs/uverbs0", "infiniband_verbs")
    event = parse_uevent(verbs, RDMA)
    assert event is not None and (event.sysname, event.subsystem) == ("uverbs0", "infiniband_verbs")


@pytest.mark.parametrize(
    "data",
    [
        uevent("add", "/devices/virtual/net/eth9", "net"),  # a subsystem not asked for
        uevent("online", "/devices/virtual/infiniband/rxe0", "infiniband"),  # not wanted
        b"remove@/devices/virtual/infiniband/rxe0\0ACTION=remove\0SUBSYSTEM=infiniband\0",
        b"",
        b"\xff\xfe@\0ACTION\0=\0SUBSYSTEM=\xff\0",  # garbage: nothing, no exception
    ],
)
def test_what_is_not_a_wanted_rdma_event_is_dropped(data: bytes) -> None:
    assert parse_uevent(data, RDMA) is None


async def until_removed(events: KernelUevents, name: str) -> list[UdevEvent]:
    seen: list[UdevEvent] = []

    async def run() -> None:
        async for event in events:
            seen.append(event)
            if event.sysname == name and event.action == "remove":
                return
        raise AssertionError("the reader ended")

    await asyncio.wait_for(run(), DEADLINE)
    return seen


async def collect(events: KernelUevents) -> list[UdevEvent]:
    return [e async for e in events]


@pytest.mark.netns
@root_only
async def test_the_kernels_events_are_read_and_a_forged_one_is_not(
    veth_names: tuple[str, str],
) -> None:
    a, b = veth_names
    events = KernelUevents({"net": WANTED["net"]})
    try:
        events.start()
        assert events._sock is not None
        port = events._sock.getsockname()[0]
        # A message to the reader's port from a process, not from the kernel: ignored.
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_KOBJECT_UEVENT) as fake:
            fake.bind((0, 0))
            fake.sendto(uevent("add", "/devices/virtual/net/forged0", "net"), (port, 0))
        subprocess.run(
            ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
            check=True,
            capture_output=True,
        )
        subprocess.run(["ip", "link", "del", a], check=True, capture_output=True)
        seen = await until_removed(events, a)
    finally:
        events.close()
    ours = [(e.action, e.sysname) for e in seen if e.sysname in (a, b, "forged0")]
    assert ("add", a) in ours and ("add", b) in ours and ("remove", a) in ours
    assert all(name != "forged0" for _, name in ours)
    assert all(e.source == "kernel" and e.devpath.endswith(f"/{e.sysname}") for e in seen)
    rest = await asyncio.wait_for(
        collect(events), DEADLINE
    )  # closed: what was queued, then the end
    assert all(e.source == "kernel" for e in rest)


def raw_uevent_socket(subsystems: tuple[str, ...] | None) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_KOBJECT_UEVENT)
    if subsystems is not None:
        attach_uevent_filter(sock, subsystems)
    sock.bind((0, 1))
    sock.settimeout(DEADLINE)
    return sock


def read_until(sock: socket.socket, last: set[str]) -> list[tuple[str, str]]:
    """(header, subsystem) of each uevent read, until every header in ``last`` was."""
    seen: list[tuple[str, str]] = []
    for _ in range(10_000):  # bounded; each recv waits at most DEADLINE
        fields = sock.recv(8192).split(b"\0")
        sub = next((f[10:] for f in fields if f.startswith(b"SUBSYSTEM=")), b"")
        seen.append((fields[0].decode(), sub.decode()))
        if last <= {header for header, _ in seen}:
            return seen
    raise AssertionError(f"{last} not all read")


@pytest.mark.netns
@root_only
def test_the_kernel_drops_other_subsystems_before_the_socket(
    veth_names: tuple[str, str],
) -> None:
    """A veth pair's queue uevents reach a socket without the filter, not one with it;
    the net uevents reach both, in the same order."""
    a, b = veth_names
    with raw_uevent_socket(None) as every, raw_uevent_socket(("net",)) as net:
        subprocess.run(
            ["ip", "link", "add", a, "type", "veth", "peer", "name", b],
            check=True,
            capture_output=True,
        )
        subprocess.run(["ip", "link", "del", a], check=True, capture_output=True)
        last = {f"remove@/devices/virtual/net/{n}" for n in (a, b)}
        seen_every, seen_net = read_until(every, last), read_until(net, last)
    ours = (f"/net/{a}", f"/net/{b}")
    queues = [h for h, sub in seen_every if sub == "queues" and any(o in h for o in ours)]
    assert queues  # without the filter, the queues' uevents come
    assert all(sub == "net" for _, sub in seen_net), seen_net

    def pair(seen: list[tuple[str, str]]) -> list[str]:
        return [h for h, sub in seen if sub == "net" and h.endswith(ours)]

    assert len(pair(seen_net)) == 4 and pair(seen_net) == pair(seen_every)


@pytest.mark.netns
@root_only
def test_the_reader_attaches_the_filter_and_warns_when_the_kernel_refuses_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    events = KernelUevents(RDMA)
    try:
        assert events.filtered
    finally:
        events.close()

    def refuse(sock: socket.socket, subsystems: object) -> None:
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr("rdmad.kernel.events.uevents.attach_uevent_filter", refuse)
    events = KernelUevents(RDMA)
    try:
        assert not events.filtered
        assert "every uevent is read" in caplog.text
    finally:
        events.close()


def set_optmem_max(netns: str, size: int) -> None:
    done = subprocess.run(
        ["ip", "netns", "exec", netns, "sysctl", "-qw", f"net.core.optmem_max={size}"],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # a kernel (< 6.9) where the limit is global, not per netns
        pytest.skip(f"net.core.optmem_max is not per namespace here: {done.stderr.strip()}")


@pytest.mark.netns
@root_only
@pytest.mark.parametrize(
    ("optmem_max", "scan"), [(20480, SCAN), (12288, SCANS[1]), (6144, SCANS[2])]
)
def test_the_filter_fits_the_option_memory_older_kernels_give_a_socket(
    netns: str, optmem_max: int, scan: int
) -> None:
    """20480 bytes: net.core.optmem_max's default up to Linux 6.8 (Debian 12, Ubuntu
    22.04, RHEL 8/9), where the byte-at-a-time program (~33 KB as eBPF) was refused with
    ENOMEM and every uevent woke the reader (measured: this one takes 13.9 KB; the
    128-byte search 7.7 KB, the 64-byte 4.7 KB). Below it, a shorter search is attached."""
    set_optmem_max(netns, optmem_max)
    sock = open_netlink_socket(NETLINK_KOBJECT_UEVENT, netns=netns, groups=1)
    try:
        assert attach_uevent_filter(sock, tuple(RDMA)) == scan
    finally:
        sock.close()


@pytest.mark.netns
@root_only
def test_too_little_option_memory_for_any_search_is_the_kernels_error(netns: str) -> None:
    set_optmem_max(netns, 2048)
    sock = open_netlink_socket(NETLINK_KOBJECT_UEVENT, netns=netns, groups=1)
    try:
        with pytest.raises(OSError) as refused:
            attach_uevent_filter(sock, tuple(RDMA))
        assert refused.value.errno == errno.ENOMEM
    finally:
        sock.close()
