"""rdmad.kernel.uevents: the kernel's uevents read off the socket (root; a veth of the test's).

The daemon reads RDMA devices this way (the lab's rxe tests show a deleted link put back
from it); here net events stand in, being the ones a test can make on this machine.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess

import pytest

from rdmad.kernel.udev import WANTED, UdevEvent
from rdmad.kernel.uevents import NETLINK_KOBJECT_UEVENT, KernelUevents, parse_uevent

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
