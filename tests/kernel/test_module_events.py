"""The udev `module` events peermem depends on (nvidia, ib_core, mlx5_ib coming, and
peermem itself going) become triggers of a pass, marked as module (driver) events."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rdmad.daemon import _udev_triggers
from rdmad.kernel.udev import UdevEvent, UdevMonitor


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
