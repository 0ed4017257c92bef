"""Triggers: the only way anything asks the agent to look at the kernel again.

Event sources, the drift timer, signals and (later) the API each ``put()`` a
``Trigger``; the agent ``take()``s everything pending as one ``Batch``. A batch
is an aggregate, not a list: a driver reload's thousand uevents cost a counter
increment each, and memory stays bounded however long a burst lasts.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, OrderedDict

import msgspec

from rdmad.clock import Cancellable, Clock

MAX_DETAILS = 8  # examples kept per batch, for logs and history
MAX_STALE_NAMES = 256  # past this many renamed/removed names, treat everything as stale
MAX_LINK_NEWS = 256  # links whose news a batch keeps; past this, netdevs are read again
# How long a lagging trigger waits for what follows it (see Trigger.lag), in s:
LAG = 0.1  # a new netdev, for the one a reaction awaits (a veth's peer comes next)
VERBS_LAG = 1.0  # a verbs device's removal, for its RDMA device's (bench/NOTES.md)
MAX_LINKS_HEARD = 4096  # links whose news the queue remembers (see TriggerQueue.put)


def device_names(touches: frozenset[str]) -> list[str]:
    """The device names among what a trigger touches (not its "ifindex:N" entries)."""
    return [n for n in touches if not n.startswith("ifindex:")]


class Trigger(msgspec.Struct, frozen=True):
    """Why the kernel should be looked at again.

    ``source``: udev, netlink, rdma, drift, api, sighup, startup, retry, followup, deadline.
    ``stale``: names may have changed (rename, removal, lost events): a plan made
    before it must not apply actions that depend on ``touches`` (netdev/RDMA names,
    PCI addresses, "ifindex:N"); a stale trigger that touches nothing in particular
    (lost events) makes every action stale. ``driver``: a module or PCI driver came
    or went (history tells a driver reload from other causes by it).

    ``narrow``: the event can only have changed netdevs or, with ``rdma``, RDMA
    devices. A pass for such triggers alone reads just those again
    (``Host.observe_changed``).
    ``urgent``: start the pass now, not after the settle window (what the previous
    pass waited for has already happened, e.g. VFs exist once sriov_numvfs returned).
    ``soon``: worth a pass shortly after the last one, a few times in a row (an action
    dropped as stale; narrow batches count as soon too, being cheap to answer).
    ``removed`` with ``rdma``: an RDMA device's `remove` uevent.
    ``added``: the kernel added the link named in touches (a new netdev, or one moved
    into this namespace): a reaction planned for it may be due (``reconcile.reactions``).
    ``announced``: the kernel's own uevent, not udevd's copy of it (which comes later,
    maybe after the device is back): only an announced RDMA removal makes a reaction due.
    ``lag``: seconds it waits for what follows it, with no pass of its own at the
    leading edge (0: none; any trigger that does not lag ends the wait). A verbs
    device's `remove` is the first uevent of its RDMA device's removal, whose own
    `remove` comes once every client of the device let it go (``VERBS_LAG``): a pass
    for the first would disarm the reaction planned for the second. The queue makes a
    new netdev lag (``LAG``) while a reaction awaits another one
    (``TriggerQueue.awaited_netdevs``): a veth's peer is announced just before it.
    ``link``: the news a link event brings, (ifindex, its RTM_NEWLINK payload, or None
    when the link was deleted): a narrow pass made only of link news and RDMA device
    events knows the netdevs without reading them again (``Batch.link_news``).
    ``echo``: a uevent about a link (add, move, remove), as (ifindex, present after it):
    when the link news already told all of it, the queue drops it (``TriggerQueue.put``).
    ``address``: the ifindex of a link whose IP addresses changed; the queue keeps it
    only when the agent watches that link's addresses (``TriggerQueue.address_watch``).
    """

    source: str
    detail: str = ""
    at: float = 0.0  # monotonic time of arrival; 0 = "now" when put
    reload: bool = False
    stale: bool = False
    driver: bool = False
    touches: frozenset[str] = frozenset()
    # Only a plan is wanted (the API's /v1/plan): observe and plan, apply nothing. A
    # batch with any other trigger in it is a full pass, whose plan answers it as well.
    plan_only: bool = False
    narrow: bool = False
    rdma: bool = False
    urgent: bool = False
    soon: bool = False
    removed: bool = False  # the kernel removed the device(s) named in touches
    added: bool = False
    announced: bool = False
    lag: float = 0.0
    link: tuple[int, bytes | None] | None = None
    echo: tuple[int, bool] | None = None
    address: int | None = None


class Batch(msgspec.Struct):
    """Everything that arrived since the last ``take()``."""

    first_at: float
    last_at: float
    count: int = 0
    sources: Counter[str] = msgspec.field(default_factory=Counter)
    details: list[str] = msgspec.field(default_factory=list)
    reload: bool = False
    stale: bool = False  # some trigger was stale: see stale_names / stale_all
    stale_all: bool = False  # lost events or too many names: every plan is stale
    stale_names: set[str] = msgspec.field(default_factory=set)
    touched: set[str] = msgspec.field(
        default_factory=set
    )  # names events in it were about (bounded)
    driver: bool = False
    plan_only: bool = True  # every trigger in it asked only for a plan
    narrow: bool = True  # every trigger in it was narrow (see Trigger)
    rdma: bool = False  # some trigger was about an RDMA device
    urgent: bool = False  # some trigger was urgent
    soon: bool = False  # some trigger was soon
    through: int = 0  # TriggerQueue.total when taken: the pass answers triggers 1..through
    # The latest news per ifindex (Trigger.link), in arrival order; ``links_unknown``: a
    # trigger may have changed netdevs without news of them (a udev net event), or too
    # many links changed: the netdevs must be read again.
    links: dict[int, bytes | None] = msgspec.field(default_factory=dict)
    links_unknown: bool = False
    # What reactions key on (bounded): netdevs announced as new, RDMA devices removed;
    # ``rdma_other``: an RDMA device event that was not a removal.
    added: set[str] = msgspec.field(default_factory=set)
    removed_rdma: set[str] = msgspec.field(default_factory=set)  # announced only
    rdma_gone: set[str] = msgspec.field(default_factory=set)  # any report of a removal
    rdma_other: bool = False
    lagging: bool = True  # every trigger in it was lagging
    lag_until: float = math.inf  # when the first of their lags ends (monotonic)

    def add(self, t: Trigger) -> None:
        self.count += 1
        self.plan_only &= t.plan_only
        self.narrow &= t.narrow
        self.urgent |= t.urgent
        self.soon |= t.soon
        self.rdma |= t.rdma
        self.first_at = min(self.first_at, t.at)
        self.last_at = max(self.last_at, t.at)
        self.sources[t.source] += 1
        if t.detail and len(self.details) < MAX_DETAILS:
            self.details.append(f"{t.source}: {t.detail}")
        self.reload |= t.reload
        self.driver |= t.driver
        if t.stale:
            self.stale = True
            if t.touches:
                self.stale_names |= t.touches
            else:
                self.stale_all = True
        if len(self.touched) < MAX_STALE_NAMES:
            self.touched |= t.touches
        self._bound_names()
        self._add_news(t)
        self.lagging &= t.lag > 0
        if t.lag > 0:
            self.lag_until = min(self.lag_until, t.at + t.lag)
        names = device_names(t.touches)
        if t.added and len(self.added) < MAX_STALE_NAMES:
            self.added.update(names)
        if t.rdma and t.removed:
            if len(self.rdma_gone) < MAX_STALE_NAMES:
                self.rdma_gone.update(names)
            if t.announced and len(self.removed_rdma) < MAX_STALE_NAMES:
                self.removed_rdma.update(names)
        elif t.rdma:
            self.rdma_other = True

    def _add_news(self, t: Trigger) -> None:
        if t.link is None:
            # An RDMA device event changes no netdev; any other narrow one may have.
            self.links_unknown |= t.narrow and not t.rdma
            return
        self._add_link(*t.link)

    def _add_link(self, index: int, message: bytes | None) -> None:
        if self.links_unknown:
            return  # the netdevs are read again anyway
        if index in self.links or len(self.links) < MAX_LINK_NEWS:
            self.links.pop(index, None)  # the latest last
            self.links[index] = message
        else:
            self.links_unknown = True
            self.links.clear()

    @property
    def news_only(self) -> bool:
        """Made of link news alone: answered without reading anything from the kernel."""
        return self.narrow and not self.rdma and not self.links_unknown and bool(self.links)

    def link_news(self) -> dict[int, bytes | None] | None:
        """What the batch's link events said, per ifindex (None: deleted); None when the
        netdevs must be read again instead (see ``links_unknown``)."""
        return None if self.links_unknown else self.links

    def absorb(self, other: Batch) -> None:
        """Take in a batch taken after this one (its triggers are answered with these)."""
        self.count += other.count
        self.first_at = min(self.first_at, other.first_at)
        self.last_at = max(self.last_at, other.last_at)
        self.sources.update(other.sources)
        self.details.extend(other.details[: max(0, MAX_DETAILS - len(self.details))])
        self.reload |= other.reload
        self.stale |= other.stale
        self.stale_all |= other.stale_all
        self.stale_names |= other.stale_names
        self.touched |= other.touched
        self.driver |= other.driver
        self.plan_only &= other.plan_only
        self.narrow &= other.narrow
        self.rdma |= other.rdma
        self.urgent |= other.urgent
        self.soon |= other.soon
        self.through = max(self.through, other.through)
        self.added |= other.added
        self.removed_rdma |= other.removed_rdma
        self.rdma_gone |= other.rdma_gone
        self.rdma_other |= other.rdma_other
        self.lagging &= other.lagging
        self.lag_until = min(self.lag_until, other.lag_until)
        self._bound_names()
        if other.links_unknown:
            self.links_unknown = True
            self.links.clear()
        for index, message in other.links.items():
            self._add_link(index, message)

    def _bound_names(self) -> None:
        if len(self.stale_names) > MAX_STALE_NAMES:
            self.stale_all = True
            self.stale_names.clear()

    def makes_stale(self, touches: frozenset[str], *, recreates: str | None = None) -> bool:
        """Whether an action depending on ``touches`` must wait for a new observation.

        ``recreates``: the RDMA device an action adds again: a report of its removal
        (udevd's copy of the kernel's, which comes later) is what the add answers.
        """
        if recreates is not None and recreates in self.rdma_gone:
            touches = touches - {recreates}
        return self.stale_all or not self.stale_names.isdisjoint(touches)

    @property
    def may_react(self) -> bool:
        """Made only of link and RDMA device events, nothing lost: the last snapshot
        with these events on it is the node now, so a reaction planned on it holds."""
        return (
            self.narrow
            and not (self.stale_all or self.reload or self.driver or self.plan_only)
            and bool(self.added or self.removed_rdma)
        )

    def describe(self) -> str:
        return ", ".join(f"{s} x{n}" if n > 1 else s for s, n in sorted(self.sources.items()))


class TriggerQueue:
    """Many producers, one consumer (the agent). Non-blocking ``put`` from the loop thread."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._batch: Batch | None = None
        self._lag_timer: tuple[float, Cancellable] | None = None  # (when, timer)
        self._waiter: asyncio.Future[bool] | None = None
        self.total = 0  # triggers ever put; a trigger's number is the total after its put
        self.by_source: Counter[str] = Counter()  # triggers ever put, per source (metrics)
        # When the last module went away (monotonic): someone is unloading modules.
        self.module_removed_at: float | None = None
        # Netdev names a reaction waits for (the agent sets them when it arms one).
        self.awaited_netdevs: frozenset[str] = frozenset()
        # Per ifindex, what link news said (names heard while present, present now),
        # most recent last and bounded: what a uevent about the same link would repeat.
        self._heard: OrderedDict[int, tuple[frozenset[str], bool]] = OrderedDict()
        self.echoes = 0  # uevents dropped as echoes of link news already heard
        # Links whose address changes start a pass: netdevs under rxe links that cannot
        # serve yet for want of a GID (the agent sets them after each pass). Any other
        # address change is dropped here: container churn costs rdmad nothing.
        self.address_watch: frozenset[int] = frozenset()

    def put(self, trigger: Trigger) -> int:
        """Queue a trigger; returns its number: the pass whose status or plan reports
        ``answered >= number`` looked at the kernel after it arrived."""
        if trigger.address is not None and trigger.address not in self.address_watch:
            return self.total
        if trigger.at == 0.0:
            now = self.clock.monotonic()
            trigger = msgspec.structs.replace(trigger, at=now)
        self._hear(trigger)
        if self._echoes(trigger):
            # udevd's copy of a netdev's add or removal comes after its rules ran, up to
            # seconds after the link news (8 s after a storm of 1,000): it would start
            # a pass of its own, a few per pass, when everything it says is known.
            self.echoes += 1
            self.by_source[trigger.source] += 1  # an event heard all the same (metrics)
            return self.total
        if trigger.added and not trigger.lag and self._unawaited(trigger):
            # Another netdev than the one a reaction waits for: a pass for it alone would
            # hold the loop while the awaited one, announced next, waits behind it.
            trigger = msgspec.structs.replace(trigger, lag=LAG)
        if self._batch is None:
            self._batch = Batch(trigger.at, trigger.at)
        self._batch.add(trigger)
        if trigger.driver and trigger.stale:  # a module's remove uevent
            self.module_removed_at = trigger.at
        self.total += 1
        self.by_source[trigger.source] += 1
        if self._batch.lagging:
            self._wake_at(self._batch.lag_until)
        else:
            self._wake(True)
        return self.total

    def _hear(self, trigger: Trigger) -> None:
        """Remember what link news says; lost news (a resync) forgets everything."""
        if trigger.link is None:
            if trigger.source == "netlink" and trigger.address is None:
                self._heard.clear()  # a resync: news was lost
            return
        index, message = trigger.link
        present = message is not None
        names = frozenset(device_names(trigger.touches))
        known = self._heard.pop(index, None)
        if known is not None and known[1] == present:
            names |= known[0]  # a rename: both names are this link's
        self._heard[index] = (names, present)
        if len(self._heard) > MAX_LINKS_HEARD:
            self._heard.popitem(last=False)

    def _echoes(self, trigger: Trigger) -> bool:
        """A uevent that says nothing the link news has not: same link, no name the
        news did not carry, and the same state (added or gone), or an add of a link
        the news has since heard gone: udevd's copy lags by as long as its rules take
        (behind a storm on a slow node, most adds arrive after their link was deleted)
        and tells of a link that is no more. Not yet heard: not an echo (the uevent
        came first, or the news was lost), so it is queued as before."""
        if trigger.echo is None:
            return False
        index, present = trigger.echo
        known = self._heard.get(index)
        if known is None or not known[0].issuperset(device_names(trigger.touches)):
            return False
        news_present = known[1]
        return news_present == present or (present and not news_present)

    def _unawaited(self, trigger: Trigger) -> bool:
        awaited = self.awaited_netdevs
        return bool(awaited) and awaited.isdisjoint(trigger.touches)

    def _wake(self, pending: bool) -> None:
        """End a ``wait``: True, a trigger is due; False, none (stop requested)."""
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(pending)

    @property
    def pending(self) -> Batch | None:
        """The batch collected so far (not taken)."""
        return self._batch

    def _lagging_now(self) -> bool:
        """The pending batch is all lagging triggers, the first of their lags not over."""
        batch = self._batch
        return batch is not None and batch.lagging and self.clock.monotonic() < batch.lag_until

    def _wake_at(self, when: float) -> None:
        """One timer for the pending batch's lag: a timer left by a batch already taken
        would end the lag of the next one early (a verbs removal's pass would then
        disarm the reflex for its RDMA device's removal)."""
        timer = self._lag_timer
        if timer is not None and timer[0] == when:
            return
        if timer is not None:
            timer[1].cancel()

        def lag_over() -> None:
            self._lag_timer = None
            self._wake(True)

        self._lag_timer = (when, self.clock.call_at(when, lag_over))

    def take(self) -> Batch | None:
        if self._lag_timer is not None:
            self._lag_timer[1].cancel()
            self._lag_timer = None
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.through = self.total
        return batch

    def wake(self) -> None:
        """Wake a ``wait`` without a trigger (stop requested)."""
        self._wake(False)

    async def wait(self, deadline: float | None = None) -> bool:
        """Until a trigger is pending (True), the deadline passes or ``wake()`` (False)."""
        if self._batch is not None and not self._lagging_now():
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiter = waiter

        def expire() -> None:
            if not waiter.done():
                waiter.set_result(False)

        timer = self.clock.call_at(deadline, expire) if deadline is not None else None
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None
