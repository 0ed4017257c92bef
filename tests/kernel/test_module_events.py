"""The udev `module` events peermem depends on (nvidia, ib_core, mlx5_ib coming, and
peermem itself going) become triggers of a pass, marked as module (driver) events."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rdmad.daemon import _udev_triggers
from rdmad.kernel.events.udev import UdevEvent, UdevMonitor
from rdmad.triggers import VERBS_LAG


class ScriptedMonitor(UdevMonitor):
    """A UdevMonitor that yields given events instead of reading a netlink socket."""

    def __init__(self, events: list[UdevEvent]) -> None:  # no socket, no pyudev context
        self._events = list(events)

    def __aiter__(self) -> AsyncIterator[UdevEvent]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[UdevEvent]:
        for e in self._events:
            yield e


@pytest.mark.parametrize(
    ("action", "module"),
    [
        ("add", "nvidia"),
        ("add", "ib_core"),
        ("add", "mlx5_ib"),
        ("remove", "nvidia_peermem"),
        ("remove", "ib_core"),
    ],
)
async def test_module_events_trigger_a_pass(action: str, module: str) -> None:
    event = UdevEvent(action, "module", module, f"/module/{module}")
    triggers = [t async for t in _udev_triggers(ScriptedMonitor([event]))]
    [t] = triggers
    assert t.source == "udev" and t.driver
    assert t.detail == f"{action} module {module}"


@pytest.mark.parametrize(
    ("action", "echo"), [("add", (7, True)), ("move", (7, True)), ("remove", (7, False))]
)
async def test_netdev_uevents_say_what_link_news_they_echo(
    action: str, echo: tuple[int, bool]
) -> None:
    event = UdevEvent(action, "net", "veth0", "/devices/virtual/net/veth0", 7, "veth0")
    (trigger,) = [t async for t in _udev_triggers(ScriptedMonitor([event]))]
    assert trigger.echo == echo


@pytest.mark.parametrize(
    "event",
    [
        UdevEvent("change", "net", "veth0", "/devices/virtual/net/veth0", 7, "veth0"),
        UdevEvent("add", "net", "veth0", "/devices/virtual/net/veth0", None, "veth0"),
        UdevEvent("add", "pci", "0000:00:03.0", "/devices/pci0000:00/0000:00:03.0"),
    ],
)
async def test_other_uevents_echo_nothing(event: UdevEvent) -> None:
    (trigger,) = [t async for t in _udev_triggers(ScriptedMonitor([event]))]
    assert trigger.echo is None


@pytest.mark.parametrize(
    ("event", "lag"),
    [
        (UdevEvent("remove", "infiniband_verbs", "uverbs0", "/devices/x/uverbs0"), VERBS_LAG),
        (UdevEvent("add", "infiniband_verbs", "uverbs0", "/devices/x/uverbs0"), 0.0),
        (UdevEvent("remove", "infiniband", "rxe0", "/devices/virtual/infiniband/rxe0"), 0.0),
    ],
)
async def test_only_a_verbs_removal_waits_for_its_rdma_devices(
    event: UdevEvent, lag: float
) -> None:
    (trigger,) = [t async for t in _udev_triggers(ScriptedMonitor([event]))]
    assert trigger.lag == lag
