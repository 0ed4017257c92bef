"""Which settings a reload cannot change: those read once, at start.

The API socket and its groups, the metrics exporters and the daemon's logging and state
directory are set up before the first pass and kept for the daemon's life; a reload
that changes one of them must say that it takes effect at the next restart, not keep
quiet while the running daemon goes on with the old value.
"""

from __future__ import annotations

import msgspec

from rdmad.model import Desired

# [daemon] keys used at start only; the others (drift_interval, settle,
# startup_timeout) are applied by every reload.
DAEMON_AT_START = ("log_format", "log_level", "state_dir")


def start_only_changes(running: Desired, new: Desired) -> tuple[str, ...]:
    """The key paths (``api.socket``, ``metrics.listen``, ...) whose value in ``new``
    differs from the one the daemon started with; they need a restart."""
    changed: list[str] = []
    for table, keys in (
        ("api", msgspec.structs.fields(running.api)),
        ("metrics", msgspec.structs.fields(running.metrics)),
    ):
        old_spec, new_spec = getattr(running, table), getattr(new, table)
        changed += [
            f"{table}.{f.name}"
            for f in keys
            if getattr(old_spec, f.name) != getattr(new_spec, f.name)
        ]
    changed += [
        f"daemon.{key}"
        for key in DAEMON_AT_START
        if getattr(running.daemon, key) != getattr(new.daemon, key)
    ]
    return tuple(changed)
