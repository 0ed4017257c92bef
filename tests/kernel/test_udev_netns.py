"""rdmad.kernel.events.udev against this machine's real uevents (root; veth in the init namespace).

This dev host runs no udevd (no /run/udev/control), so there only the kernel
source can deliver events and the test uses it; where udevd runs, the udev
source is used, as in the daemon. The choice is ``default_source()``'s.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from rdmad.kernel.events.udev import UdevEvent, UdevMonitor, default_source, to_event

DEADLINE = 10.0

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for veth and uevents")


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


async def until(monitor: UdevMonitor, done: Callable[[list[UdevEvent]], bool]) -> list[UdevEvent]:
    seen: list[UdevEvent] = []

    async def run() -> None:
        async for event in monitor:
            seen.append(event)
            if done(seen):
                return

    await asyncio.wait_for(run(), DEADLINE)
    return seen


@pytest.mark.netns
@root_only
async def test_veth_add_and_remove_are_seen(veth_names: tuple[str, str]) -> None:
    a, b = veth_names
    source = default_source()
    async with UdevMonitor(source=source) as monitor:
        ip("link", "add", a, "type", "veth", "peer", "name", b)
        added = await until(
            monitor,
            lambda seen: {a, b} <= {e.interface for e in seen if e.action == "add"},
        )
        ip("link", "del", a)  # takes the peer with it
        removed = await until(
            monitor,
            lambda seen: {a, b} <= {e.interface for e in seen if e.action == "remove"},
        )
    add_a = next(e for e in added if e.action == "add" and e.interface == a)
    assert add_a.subsystem == "net" and add_a.sysname == a and add_a.source == source
    assert add_a.devpath.endswith(f"/net/{a}")
    assert isinstance(add_a.ifindex, int) and add_a.ifindex > 0
    assert all(
        e.subsystem in ("net", "pci", "infiniband", "infiniband_verbs", "module")
        for e in added + removed
    )
    assert any(e.action == "remove" and e.interface == b and e.ifindex for e in removed)


@pytest.mark.netns
@root_only
async def test_closed_monitor_stops_iteration() -> None:
    monitor = UdevMonitor()
    async with monitor:
        waiter = asyncio.ensure_future(monitor.__anext__())
        await asyncio.sleep(0)  # let it block on the queue
        monitor.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiter, DEADLINE)
    # closing twice and iterating after close are fine
    monitor.close()
    assert [e async for e in monitor] == []


def _device(action: str, subsystem: str, initialized: bool = True, **props: str) -> object:
    return SimpleNamespace(
        action=action,
        subsystem=subsystem,
        sys_name=props.pop("sysname", "x"),
        device_path=props.pop("devpath", "/devices/x"),
        is_initialized=initialized,
        properties=props,
        driver=props.get("DRIVER"),
    )


def test_to_event_filters_noise_and_reads_renames() -> None:
    assert to_event(_device("change", "pci"), "udev") is None  # config-space noise
    assert to_event(_device("online", "module"), "udev") is None
    assert to_event(_device("add", "block"), "udev") is None
    # from udev, a net device not yet initialised is not reported; from the kernel it is
    assert to_event(_device("add", "net", initialized=False, IFINDEX="7"), "udev") is None
    assert to_event(_device("add", "net", initialized=False, IFINDEX="7"), "kernel") is not None
    moved = to_event(
        _device(
            "move",
            "net",
            sysname="enp1s0v0",
            devpath="/devices/pci0000:00/0000:01:10.0/net/enp1s0v0",
            IFINDEX="9",
            INTERFACE="enp1s0v0",
            DEVPATH_OLD="/devices/pci0000:00/0000:01:10.0/net/eth1",
        ),
        "udev",
    )
    assert moved == UdevEvent(
        "move",
        "net",
        "enp1s0v0",
        "/devices/pci0000:00/0000:01:10.0/net/enp1s0v0",
        ifindex=9,
        interface="enp1s0v0",
        old_name="eth1",
        source="udev",
    )
    bound = to_event(_device("bind", "pci", sysname="0000:01:10.0", DRIVER="vfio-pci"), "udev")
    assert bound is not None and bound.driver == "vfio-pci"
    mod = to_event(_device("add", "module", sysname="nvidia_peermem"), "udev")
    assert mod is not None and mod.sysname == "nvidia_peermem"
