"""The fast path of a pass: what lets it answer link and RDMA device events in
milliseconds. Three shortcuts, each a cheaper way to do a step of the slow path, each
checked by a pass that follows:

* reactions (``reconcile.reactions``): a pass that ends at rest plans ahead what the
  events it awaits will call for (``arm``); the pass such events start applies it on the
  last observation before it observes (``react``), and its observation is the check;
* reflexes (``Reflexive``, kernel.events.reflex): the rxe adds among those reactions are armed
  on the host's event readers, which send them as the event is read, before the pass
  begins, each asked through ``gate`` first; that pass waits for their outcome
  (``reflexes_answered``) and ``react`` collects it through apply();
* a narrow observation (``NarrowObserver``): after link and RDMA device events only,
  only what they can have changed is read (``observe``), with link news that came while
  it ran folded in. None from it: the runner reads everything.

The runner calls it at four points (``reflexes_answered`` before the pass, ``react``
first in it, ``observe``, ``arm`` last in a pass at rest) and knows nothing of its state.
The whole order of a pass is told in ``agent.runner``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import structlog

from rdmad.agent.applying import Applied, Applier, made_stale
from rdmad.agent.memory import Memory
from rdmad.agent.options import Shared
from rdmad.agent.protocols import Host, NarrowObserver, Planner, Reflexive
from rdmad.model import Action, AddRxe, Observed
from rdmad.reconcile.reactions import NONE, Reactions, anticipate
from rdmad.triggers import Batch

log = structlog.get_logger("rdmad.agent")

# A narrow pass takes in link news that came while it observed, this many times at most,
# giving the event sources SOURCE_TURNS loop turns each time to read their sockets.
MAX_NEWS_FOLDS = 3
SOURCE_TURNS = 3
# Added to the cause of what a reaction applied (history, status): why it was so quick.
PLANNED_AHEAD = " (planned ahead)"
# ...and sent by the event reader itself (kernel.events.reflex), before the pass began.
SENT_ON_EVENT = " (planned ahead, sent as the event was read)"


class FastPath:
    def __init__(
        self,
        shared: Shared,
        *,
        host: Host,
        memory: Memory,
        applier: Applier,
        cause: Callable[[Batch], str],
    ) -> None:
        self.shared = shared
        self.memory = memory
        self.applier = applier
        self._cause = cause  # the runner's: what started the pass, as history tells it
        self.narrow_passes = 0  # passes that read only what link events changed
        self.reactions_applied = 0  # passes that began with a reaction
        self._reactions: Reactions = NONE  # armed by the last pass that ended at rest
        self._reactions_on: Observed | None = None  # what they were planned on
        # Checked once: a runtime protocol check costs about what a narrow pass's plan does.
        self._narrow_host = host if isinstance(host, NarrowObserver) else None
        self._reflexive = host if isinstance(host, Reflexive) else None
        self._reflex_sent: set[str] = set()  # rxe links a reflex sent since it was armed

    # --- before the pass: the reflexes' outcome --------------------------------------------

    async def reflexes_answered(self) -> None:
        """Until every add an event reader sent since the last pass has its outcome."""
        if self._reflexive is not None and self._reflex_sent:
            # An add the event reader sent may be sent again while the kernel releases
            # the old device's name: its timers need the loop more than this pass does,
            # which would only wait for it in apply().
            await self._reflexive.reflexes_answered()

    # --- first in the pass: the reaction ---------------------------------------------------

    async def react(self, batch: Batch) -> Applied | None:
        """Apply what the last pass planned ahead for this batch's events; None: nothing.

        The reactions hold only for the node the last pass saw, changed by nothing but
        this batch's events: a batch with anything else in it (a lost event, a reload, a
        driver, an RDMA device that came) disarms them, and an action whose names the
        batch renamed or removed is left to the pass. The pass that follows observes
        the RDMA links again and is the reaction's check.

        An add an event reader already sent (Reflexive) is applied here whatever the
        batch holds: the kernel has it (or refused it), and only apply() records it;
        its own device's `add` uevent, read before this pass began, is in the batch.
        """
        if batch.plan_only:
            return None  # the API's plan: it applies nothing, and leaves them armed
        reactions, on = self._reactions, self._reactions_on
        self._set_reactions(NONE, None)
        if not reactions or on is None:
            return None
        sent = [a for a in _adds_of(reactions) if a.name in self._reflex_sent]
        due: list[Action] = []
        if not batch.rdma_other and batch.may_react:
            due = self._due(reactions, batch)
            if not due and not sent and reactions.on_netdev and batch.news_only:
                # A veth pair's peer is announced first: the netdev awaited may be next.
                more = await self._more_news()
                if more is not None:
                    batch.absorb(more)
                    if not batch.rdma_other and batch.may_react:
                        due = self._due(reactions, batch)
        due += [a for a in sent if a not in due]
        if not due:
            return None
        self.reactions_applied += 1
        log.debug("reconcile.reaction", actions=[a.describe() for a in due])
        cause = f"{self._cause(batch)}{SENT_ON_EVENT if sent else PLANNED_AHEAD}"
        done = await self.applier.apply_all(due, cause, on, frozenset(batch.touched))
        batch.rdma = True  # the pass reads the RDMA links the reaction changed
        return done

    @staticmethod
    def _due(reactions: Reactions, batch: Batch) -> list[Action]:
        """The reactions this batch's events make due, less those it made stale (an
        RDMA device's own removal is what its reaction waits for: not stale for it)."""
        out = []
        for action in reactions.due(sorted(batch.added), sorted(batch.removed_rdma)):
            if not made_stale(batch, action) and action not in out:
                out.append(action)
        return out

    async def _more_news(self) -> Batch | None:
        """Link news the event sources put within SOURCE_TURNS loop turns, taken."""
        queue = self.shared.queue
        for _turn in range(SOURCE_TURNS):
            await asyncio.sleep(0)  # a reader callback, then the source's task
        more = queue.pending
        if more is None or not more.news_only:
            return None  # nothing, or something to read (e.g. RDMA devices): a pass
        return queue.take()

    # --- the observation: narrow when events tell what changed -----------------------------

    async def observe(self, batch: Batch, first: bool) -> Observed | None:
        """After link events, only what they can have changed; None: observe() instead.

        The narrow read is the event path's: an rxe link whose netdev just appeared
        is added from the link event's own news (at most one netlink dump), not a walk of
        sysfs and /proc. A pass whose plan changed the kernel is followed by a full
        one, which verifies it; what a reaction applied is checked by the observation of
        the pass it began (and a pass that ends at rest arms the next reaction at once).
        """
        narrow = batch.narrow and not (first or batch.reload or batch.driver or batch.stale_all)
        if not narrow or self._narrow_host is None:
            return None
        observed = await self._narrow_host.observe_changed(batch.rdma, batch.link_news())
        if observed is not None:
            observed = await self._fold_news(batch, observed)
        if observed is not None:
            self.narrow_passes += 1
        return observed

    async def _fold_news(self, batch: Batch, observed: Observed) -> Observed | None:
        """Link news that came while a narrow observation ran, taken into it.

        A veth pair, or a netdev and its VLAN, are announced one after the other; a
        pass started by the first would plan without the second, and its news could be
        read only when the pass ends (the loop is busy until then). So the event sources
        get a few loop turns, and news they put meanwhile is read into this pass (the
        batch absorbs it: this pass answers those triggers). None: observe() instead.
        """
        assert self._narrow_host is not None
        if batch.plan_only or not batch.links:
            return observed  # not started by link news: nothing is announced in pairs
        for _ in range(MAX_NEWS_FOLDS):
            taken = await self._more_news()
            if taken is None:
                return observed
            batch.absorb(taken)
            folded = await self._narrow_host.observe_changed(taken.rdma, taken.link_news())
            if folded is None:
                return None
            observed = folded
        return observed

    # --- last in a pass at rest: plan ahead, arm -------------------------------------------

    def arm(self, planner: Planner, observed: Observed, actions: list[Action]) -> None:
        """Plan ahead on this observation what awaited events will call for, and arm it
        (the queue's awaited netdevs, the host's reflexes)."""
        try:
            reactions = anticipate(
                self.memory.desired, observed, self.memory.plan_state(), planner, actions
            )
        except Exception:  # a bug in plan(): its own pass reports those; nothing armed
            log.exception("reactions.crashed")
            return
        self._set_reactions(reactions, observed)

    def _set_reactions(self, reactions: Reactions, on: Observed | None) -> None:
        self._reactions, self._reactions_on = reactions, on
        # A new netdev other than these waits a little for them (TriggerQueue.put).
        self.shared.queue.awaited_netdevs = frozenset(reactions.on_netdev)
        host = self._reflexive
        if host is None:
            return
        if reactions and not self.shared.options.dry_run:
            # The event readers send these adds themselves, before this loop hears of
            # the event; the pass it starts collects the outcome (Reflexive).
            self._reflex_sent.clear()
            host.arm_reflexes(
                _adds(reactions.on_netdev),
                _adds(reactions.on_rdma_removed),
                self._gate,
                self._made,
            )
        else:
            host.disarm_reflexes()

    def _gate(self, action: AddRxe) -> bool:
        """Right before a reflex sends ``action``: only if the reaction would still be
        applied (nothing pending that disarms it or makes it stale)."""
        if self.applier.stopping:
            return False
        pending = self.shared.queue.pending
        if pending is not None and (
            pending.rdma_other or not pending.may_react or made_stale(pending, action)
        ):
            return False
        self._reflex_sent.add(action.name)
        return True

    def _made(self, action: AddRxe) -> None:
        """The kernel made the link a reflex sent: claimed at once, in the reader's
        callback. After the send, not before as a pass claims (Applier._claim_before_create):
        the claim's write is the dearest step of the event path under emulation (~1 ms,
        ext4), and a claim only for a link the kernel made can never make someone
        else's link of that name rdmad's (kernel.events.reflex)."""
        self.memory.claim_rxe(action.name)


def _adds_of(reactions: Reactions) -> list[AddRxe]:
    """Every rxe add the reactions hold, once."""
    out: list[AddRxe] = []
    for by_event in (reactions.on_netdev, reactions.on_rdma_removed):
        for adds in _adds(by_event).values():
            out += [a for a in adds if a not in out]
    return out


def _adds(by_event: Mapping[str, tuple[Action, ...]]) -> dict[str, list[AddRxe]]:
    """The rxe adds of reactions, by the name whose event makes them due."""
    out: dict[str, list[AddRxe]] = {}
    for name, actions in by_event.items():
        adds = [a for a in actions if isinstance(a, AddRxe)]
        if adds:
            out[name] = adds
    return out
