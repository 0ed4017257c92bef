"""What the agent knows beyond one pass: the config in force and the state file.

A bad config keeps the last good one (or, at start, manages nothing); the state
file tells a restart from a reboot and keeps history, but is never needed to be
safe: losing it only means rdmad owns no rxe link and removes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from rdmad.agent.options import Shared
from rdmad.agent.protocols import ConfigLoader
from rdmad.config import ConfigInvalid
from rdmad.config.restart import start_only_changes
from rdmad.model import Desired, Observed, PlanState, UnsupportedKey
from rdmad.peermem import Held
from rdmad.reconcile import declared_objects
from rdmad.state import State, StateStore, owned_rxe, start_kind
from rdmad.status import HistoryEntry

log = structlog.get_logger("rdmad.agent")

Record = Callable[..., None]  # Reporter.history


class Memory:
    def __init__(
        self,
        shared: Shared,
        *,
        load_config: ConfigLoader,
        state_store: StateStore | None,
        boot_id: str,
        record: Record,
    ) -> None:
        self.shared = shared
        self.load_config = load_config
        self.state_store = state_store
        self.record = record
        self.desired = Desired()
        self.config_files: tuple[str, ...] = ()
        self.config_errors: tuple[str, ...] = ()
        self.config_ok = False  # a valid config was loaded at least once
        self.state = State(boot_id=boot_id)
        self.boot_id = boot_id
        self.start_kind = ""
        self.notes: list[str] = []  # state-file problems, for status
        # Every claim in state.managed_rxe is on disk (the state file or the claims
        # file's last line): False after a claims write failed, until one succeeds.
        self._claims_on_disk = True
        # VF attributes the PF driver refused as unsupported; forgotten on a config reload.
        self.unsupported: set[UnsupportedKey] = set()
        # A peermem load that failed for a lasting reason; forgotten on a config reload,
        # and moot (plan() retries) once the facts it failed on change.
        self.peermem_held: Held | None = None
        # What the daemon started with, and the keys of the config in force that differ
        # from it: a reload cannot change them (rdmad.config.restart).
        self.in_effect: Desired | None = None
        self.needs_restart: tuple[str, ...] = ()
        # Of those, the keys the command line sets: a restart does not apply them either.
        self.pinned: tuple[str, ...] = ()

    def plan_state(self) -> PlanState:
        if not self.config_ok:
            return PlanState()  # nothing declared: own nothing, remove nothing
        return PlanState(
            frozenset(self.state.managed_rxe), frozenset(self.unsupported), self.peermem_held
        )

    def forget_peermem_hold(self) -> None:
        """A module add/remove event: what a lasting peermem failure depended on may have
        changed even when the loaded set looks the same again (an RDMA stack restart)."""
        if self.peermem_held is not None:
            log.info("peermem.retry", after="module event", finding=self.peermem_held.finding.id)
            self.peermem_held = None

    def objects(self) -> set[str]:
        return set(declared_objects(self.desired))

    # --- config ----------------------------------------------------------------------------

    def reload_config(self, initial: bool) -> bool:
        """Load the config; on errors keep the last good one. True when a config was loaded."""
        clock = self.shared.clock
        try:
            loaded = self.load_config()
        except ConfigInvalid as exc:
            self.config_errors = tuple(str(e) for e in exc.errors)
            for err in exc.errors:
                log.error("config.invalid", error=str(err))
            kept = "last good config kept" if self.config_ok else "nothing is managed"
            self.record(
                HistoryEntry(
                    clock.wall(),
                    "config-invalid",
                    what=f"{len(exc.errors)} error(s); {kept}",
                    error="; ".join(self.config_errors)[:1000],
                    cause="start" if initial else "reload",
                )
            )
            return False
        self.desired = loaded.desired
        self.config_files = loaded.files
        self.config_errors = ()
        self.config_ok = True
        self.shared.options = self.shared.options.with_config(loaded.desired)
        self.unsupported.clear()  # a new config may fix what the driver refused
        self.peermem_held = None  # a reload is how a user says "try again"
        if self.in_effect is None:
            self.in_effect = self.shared.options.started_with or loaded.desired
        changed = start_only_changes(self.in_effect, loaded.desired)
        given = self.shared.options.command_line
        self.pinned = tuple(k for k in changed if k in given)
        self.needs_restart = tuple(k for k in changed if k not in given)
        log.info(
            "config.loaded",
            files=list(loaded.files),
            objects=len(self.objects()),
            reload=not initial,
        )
        if self.needs_restart:
            log.warning("config.needs_restart", keys=list(self.needs_restart))
        if self.pinned:
            log.warning("config.command_line_wins", keys=list(self.pinned))
        if not initial:
            self.record(
                HistoryEntry(
                    clock.wall(),
                    "config-reloaded",
                    what=", ".join(loaded.files) or "no config files",
                    reason=self.restart_note() or "",
                    cause="reload",
                )
            )
        return True

    def restart_note(self) -> str | None:
        """What the config in force changes that only a restart applies, and what it
        changes that the command line sets (never applied), or None."""
        notes = []
        if self.needs_restart:
            notes.append(
                f"the config changes {', '.join(self.needs_restart)}: read at start only, "
                "in effect after `systemctl restart rdmad`; until then the old values stay"
            )
        if self.pinned:
            options = ", ".join("--" + k.split(".", 1)[1].replace("_", "-") for k in self.pinned)
            notes.append(
                f"the config changes {', '.join(self.pinned)}, which rdmad's command line "
                f"sets ({options}): the command line wins, also after a restart"
            )
        return "; ".join(notes) or None

    # --- state -----------------------------------------------------------------------------

    def load_state(self) -> list[HistoryEntry]:
        """Read the state file; returns the history it held (for the status store)."""
        if self.state_store is None:
            self.start_kind = "unknown (no state dir)"
            return []
        previous, problem = self.state_store.load()
        self.start_kind = start_kind(previous, self.boot_id, problem)
        if problem:
            log.warning("state.rebuilt", problem=problem)
            self.notes.append(problem)
            self.record(HistoryEntry(self.shared.clock.wall(), "state-rebuilt", error=problem))
        if previous is None:
            return []
        if previous.dropped:
            # One warning for the whole file; the first pass saves it rebuilt without them.
            n = len(previous.dropped)
            what = f"{self.state_store.path}: {n} odd {'entry' if n == 1 else 'entries'} dropped"
            log.warning(
                "state.entries-dropped", path=str(self.state_store.path), dropped=previous.dropped
            )
            self.notes.append(f"{what}: {'; '.join(previous.dropped)[:300]}")
            self.record(
                HistoryEntry(
                    self.shared.clock.wall(),
                    "state-rebuilt",
                    what=what,
                    error="; ".join(previous.dropped)[:1000],
                )
            )
        # Links rdmad created are its own only within the boot that made them (the same
        # rule `rdmad plan` applies): after a reboot their names may be someone else's.
        self.state.managed_rxe = set(owned_rxe(previous, self.boot_id))
        self.state.applied = previous.applied
        self.state.last_errors = previous.last_errors
        self.state.history = list(previous.history)
        return list(previous.history)

    def save_state(self) -> None:
        if self.state_store is None or self.shared.options.dry_run:
            return
        problem = self.state_store.save(self.state)
        if problem is not None and problem not in self.notes:
            log.warning("state.not-saved", problem=problem)
            self.notes.append(problem)

    def claim_rxe(self, name: str) -> None:
        """Write down an rxe link as rdmad's before creating it (``Applier``), or as
        the kernel acks an add an event reader sent (``FastPath``).

        A link already claimed, with every claim on disk, is not written again: the
        pass that collects a reflex's outcome claims the link "before creating it"
        too, after the reflex claimed it at the kernel's ack (an ext4 append, ~1 ms
        under emulation, for a line the last one already holds)."""
        if name in self.state.managed_rxe and self._claims_on_disk:
            return
        self.state.managed_rxe.add(name)
        self._write_claims()

    def unclaim_rxe(self, name: str) -> None:
        """An rxe link claimed before its create, which the kernel did not make: not
        rdmad's, on disk too (a claims line without it). Until the next save the last
        line would still hold it, and a crash meanwhile would make a link of that name
        someone else made (EEXIST) rdmad's after the restart."""
        if name in self.state.managed_rxe:
            self.state.managed_rxe.discard(name)
            self._write_claims()

    def _write_claims(self) -> None:
        """The links rdmad owns now, as the claims file's last line (state.StateStore)."""
        if self.state_store is None or self.shared.options.dry_run:
            return
        problem = self.state_store.claim_rxe(self.boot_id, self.state.managed_rxe)
        self._claims_on_disk = problem is None
        if problem is not None and problem not in self.notes:
            log.warning("state.not-saved", problem=problem)
            self.notes.append(problem)

    def forget_vanished_rxe(self, observed: Observed) -> None:
        """A managed rxe link that is gone is no longer ours: a link someone makes later
        under the same name must never be deleted as rdmad's."""
        present = {link.name for link in observed.rdma_links if link.is_rxe}
        gone = self.state.managed_rxe - present
        if gone:
            log.info("rxe.forgotten", links=sorted(gone))
            self.state.managed_rxe -= gone
