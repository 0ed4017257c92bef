"""The daemon's event sources on this machine: where udevd runs, RDMA device events
come from the kernel's own uevents only (not udevd's copies, parsed through pyudev);
without that reader, from udevd as before."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rdmad import daemon
from rdmad.kernel.events import udev
from rdmad.kernel.events.uevents import KernelUevents


def _close(closers: list[object]) -> None:
    for thing in closers:
        close = getattr(thing, "close", None)
        if close is not None:
            close()


@pytest.fixture
def udevd(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """As on a node where udevd runs (this test machine may have none)."""
    monkeypatch.setattr(udev, "default_source", lambda: "udev")
    yield


async def test_rdma_devices_come_from_the_kernel_and_udevd_brings_the_rest(udevd: None) -> None:
    sources, closers = daemon._event_sources()
    try:
        monitors = [c for c in closers if isinstance(c, udev.UdevMonitor)]
        readers = [c for c in closers if isinstance(c, KernelUevents)]
        assert len(monitors) == 1 and len(readers) == 1
        assert set(readers[0].wanted) == {"infiniband", "infiniband_verbs"}
        assert set(monitors[0].subsystems) == {"net", "pci", "module"}
        assert {s.name for s in sources} == {"udev", "uevent", "rtnetlink"}
    finally:
        _close(closers)


async def test_without_the_kernel_reader_udevd_brings_rdma_devices_too(
    udevd: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(1, "not permitted")

    monkeypatch.setattr(KernelUevents, "__init__", refuse)
    sources, closers = daemon._event_sources()
    try:
        [monitor] = [c for c in closers if isinstance(c, udev.UdevMonitor)]
        assert set(monitor.subsystems) == set(udev.SUBSYSTEMS)
        assert {s.name for s in sources} == {"udev", "rtnetlink"}
    finally:
        _close(closers)
