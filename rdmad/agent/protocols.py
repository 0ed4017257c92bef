"""What the agent needs from the outside, declared once: the host it drives
(KernelHost or RecordingHost), sd_notify, the config loader and the planner.

The agent imports nothing from ``rdmad.kernel``; tests pass fakes that fit these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from rdmad.config import LoadedConfig
from rdmad.model import Action, AddRxe, Desired, Observed, ObserveScope, PlanState


class WriteLike(Protocol):
    """One kernel write as the host reports it (rdmad.kernel.apply.results.WriteRecord)."""

    @property
    def target(self) -> str: ...
    @property
    def old(self) -> object: ...
    @property
    def new(self) -> object: ...
    @property
    def error(self) -> BaseException | None: ...
    @property
    def dry_run(self) -> bool: ...


class ResultLike(Protocol):
    """What became of one action (rdmad.kernel.apply.results.ApplyResult)."""

    @property
    def ok(self) -> bool: ...
    @property
    def writes(self) -> Sequence[WriteLike]: ...
    @property
    def note(self) -> str: ...
    @property
    def stale(self) -> bool: ...  # dropped unapplied: the kernel changed since the plan


class Host(Protocol):
    async def observe(self) -> Observed: ...

    async def apply(self, action: Action) -> ResultLike: ...


@runtime_checkable
class NarrowObserver(Protocol):
    """A host that can observe only what link events change (KernelHost).

    ``links``: the batch's link news (``Batch.link_news``: ifindex -> RTM_NEWLINK payload,
    None for a deleted link), opaque here; None: read the netdevs again.
    """

    async def observe_changed(
        self, rdma: bool, links: Mapping[int, bytes | None] | None = None
    ) -> Observed | None: ...  # None: observe()


@runtime_checkable
class Reflexive(Protocol):
    """A host whose event readers can send rxe adds themselves (KernelHost, kernel.events.reflex).

    Armed by a pass that ends at rest with the adds its reactions hold; disarmed when the
    next pass starts. ``gate`` is asked right before each send, ``made`` told as soon as
    the kernel made the link (the claim); its apply() collects the outcome of an add a
    reflex sent instead of sending it again.
    """

    def arm_reflexes(
        self,
        on_netdev: Mapping[str, Sequence[AddRxe]],
        on_removed: Mapping[str, Sequence[AddRxe]],
        gate: Callable[[AddRxe], bool],
        made: Callable[[AddRxe], None],
    ) -> None: ...

    def disarm_reflexes(self) -> None: ...

    async def reflexes_answered(self) -> None:
        """Until every add a reflex sent has its outcome (bounded)."""


@runtime_checkable
class Scoped(Protocol):
    """A host that reads the costly sources (the module tree, kallsyms) only for what
    the declaration asks (KernelHost): told at each config load."""

    def set_scope(self, scope: ObserveScope) -> None: ...


class Notifier(Protocol):
    """sd_notify; a no-op outside systemd."""

    def notify(self, state: str) -> None: ...


class NullNotifier:
    def notify(self, state: str) -> None:
        pass


ConfigLoader = Callable[[], LoadedConfig]  # raises ConfigInvalid with every error
Planner = Callable[[Desired, Observed, PlanState], list[Action]]
