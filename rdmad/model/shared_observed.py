"""The observed values the driver guard reads too: whether something is in use, an RDMA
link, a guarded stop, the guard's modprobe.d hook (frozen dataclasses).

Standard library only: the guard runs inside ``modprobe -r``, also from a copy of the
package under the host's own python3 (the DaemonSet's guard kit), where msgspec is not
installed. The rest of the observed model (``rdmad.model.observed``) is msgspec Structs,
which cost ~1/30 of a dataclass to define at start-up and less to build by the
hundred in each observation; it re-exports these.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Use(enum.Enum):
    """Whether something is in use. UNKNOWN counts as in use everywhere."""

    FREE = "free"
    IN_USE = "in-use"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Usage:
    state: Use
    holders: tuple[str, ...] = ()  # e.g. "pid 1234 (qemu-system-x86) holds /dev/vfio/42"

    @property
    def busy(self) -> bool:
        return self.state is not Use.FREE

    def describe(self) -> str:
        if self.state is Use.FREE:
            return "free"
        if self.holders:
            return "; ".join(self.holders)
        return "owner unknown, treated as in use"


FREE = Usage(Use.FREE)


@dataclass(frozen=True, slots=True)
class RdmaLinkObserved:
    """An RDMA device (port 1) and the netdev it is bound to.

    ``port_state``: port 1's state as the kernel names it ("ACTIVE", "DOWN", "INIT", ...),
    None when not read. ``gids``: the valid GIDs of port 1 (sysfs notation), None when
    not read; what RoCE traffic and rdma_cm can address the device by.
    """

    name: str
    driver: str | None  # "rxe", "mlx5_core", ... (kernel driver of the ib device)
    netdev: str | None
    netdev_ifindex: int | None = None
    usage: Usage = FREE
    port_state: str | None = None
    gids: tuple[str, ...] | None = None

    @property
    def is_rxe(self) -> bool:
        return self.driver == "rxe"


@dataclass(frozen=True, slots=True)
class PauseObserved:
    """A guarded stop in progress: rdmad loads no module and creates no rxe link until
    ``until`` (UNIX time) or until one of ``modules`` is loaded again."""

    by: str  # who asked: "modprobe -r igb (pid 812, uid 0)", "rdmad-ctl pause (uid 0)"
    reason: str
    since: float
    until: float
    modules: tuple[str, ...] = ()
    # Set once it is over: when, and why ("it ran out", "ib_core is loaded again", ...).
    ended_at: float | None = None
    ended_why: str | None = None

    def describe(self) -> str:
        back = f" or until {' or '.join(self.modules)} is loaded again" if self.modules else ""
        return (
            f"paused by {self.by} ({self.reason}) for at most {self.until - self.since:.0f} s{back}"
        )


@dataclass(frozen=True, slots=True)
class OpenibdObserved:
    """MOFED/DOCA's openibd.service and rdmad's drop-in for it (rdmad.openibd).

    ``unit``: the unit exists (not masked). ``unknown``: why its own ExecStop= cannot be
    read ("" when it can). ``dropin``: rdmad's drop-in is absent, reads as this rdmad
    would write it from the unit's files now (current), or not (stale)."""

    unit: bool = False
    unknown: str = ""
    dropin: str = "absent"  # absent | current | stale


@dataclass(frozen=True, slots=True)
class GuardHookObserved:
    """rdmad's modprobe.d guard file: which modules it guards, and whether its text is
    what this rdmad would write (False: another version's command, or edited by hand);
    and openibd.service's drop-in, which goes with it."""

    modules: frozenset[str] = frozenset()
    current: bool = True
    present: bool = False
    openibd: OpenibdObserved = field(default_factory=OpenibdObserved)
