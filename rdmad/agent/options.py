"""The agent's knobs, and the record of one pass; plus what every part shares."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import msgspec

from rdmad.backoff import Backoff
from rdmad.clock import Clock
from rdmad.model import Desired
from rdmad.triggers import TriggerQueue


class AgentOptions(msgspec.Struct, frozen=True):
    settle: float = 0.15
    settle_max: float = 2.0  # a continuous stream of triggers still gets a pass this often
    burst: int = 8  # this many pending triggers make a burst: wait for quiet, not the window
    drift_interval: float = 300.0
    drift_jitter: float = 0.1  # ± fraction, so a fleet does not observe in lockstep
    startup_timeout: float = 30.0  # READY=1 at the latest this long after start
    max_followups: int = 5  # consecutive passes that changed the kernel before giving up
    vf_wait: float = 30.0  # VFs must appear this long after sriov_numvfs was written
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    backoff_jitter: float = 0.1
    watchdog_interval: float | None = None  # seconds between WATCHDOG=1 (half WATCHDOG_USEC)
    action_budget: float = 60.0  # an action running longer means the loop is stuck
    # numvfs writes (65 s seen), modprobe (120 s timeout), eSwitch mode changes (300 s)
    long_action_budget: float = 330.0
    dry_run: bool = False
    # The settings read once at start ([api], [metrics], [daemon] logging and state_dir),
    # as the daemon set itself up with them; None: those of the first config loaded.
    started_with: Desired | None = None
    # Config keys the daemon's command line sets (``daemon.log_level`` for --log-level):
    # the command line wins over the config, now and after a restart.
    command_line: tuple[str, ...] = ()

    def with_config(self, desired: Desired) -> AgentOptions:
        d = desired.daemon
        return msgspec.structs.replace(
            self,
            settle=d.settle,
            drift_interval=d.drift_interval,
            startup_timeout=d.startup_timeout,
        )


class PassInfo(msgspec.Struct, frozen=True):
    """One reconcile pass, for tests and the benchmark."""

    started: float  # monotonic
    first_trigger_at: float  # monotonic arrival of the oldest trigger it answers
    triggers: int
    cause: str
    seconds: float
    applied: int
    changed: bool


PASSES_KEPT = 1_000


class Shared(msgspec.Struct):
    """What the agent's parts share: time, the trigger queue, the options in force
    (replaced when a config is loaded), per-object backoff and the passes so far."""

    clock: Clock
    queue: TriggerQueue
    options: AgentOptions
    backoff: Backoff
    rng: Callable[[], float]
    # The latest passes, for tests and benchmarks; 247 bytes each, so a daemon under a
    # flapping link would grow by megabytes before a larger bound filled (the soak).
    passes: deque[PassInfo] = msgspec.field(default_factory=lambda: deque(maxlen=PASSES_KEPT))
    # Passes ever run: ``passes`` keeps only the latest, so its length stops growing.
    pass_count: int = 0

    def add_pass(self, info: PassInfo) -> None:
        self.passes.append(info)
        self.pass_count += 1
