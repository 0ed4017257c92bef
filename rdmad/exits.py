"""The exit codes of rdmad and rdmad-ctl, one table for both, and the JSON error object
either prints on stdout with ``--json`` when a command fails.

Scripts, the Ansible role and the DaemonSet's probes test these numbers, so they are
defined here once: both tools return them, their ``--help`` and man pages (EXIT
STATUS) are rendered from ``TABLE``, and README.md's table is checked against it
(tests/ctl/test_exit_codes.py). Standard library only: rdmad-ctl imports it.
"""

from __future__ import annotations

import argparse
import json
import sys

TYPE_CHECKING = False  # typing costs rdmad-ctl 4 ms to import; annotations are strings
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO

OK = 0
FAIL = 1  # not as declared (not converged, a plan that stays blocked), or the command failed
USAGE = 2  # bad arguments (argparse's own code), a --root that is not a directory
NOT_RUNNING = 3  # nothing listens on the socket: rdmad is not running
DENIED = 4  # the socket or the API refused us (not root, not in the API's group)
NO_ANSWER = 5  # rdmad listens but did not answer in time: hung (a liveness probe's "dead")
CONFIG_INVALID = 6  # the config has errors (each one FILE:LINE: key: message)
INTERRUPTED = 130  # Ctrl-C during a one-shot command (watch exits 0 on Ctrl-C)

# code, its name in the JSON error object, what it means to an operator.
TABLE: tuple[tuple[int, str, str], ...] = (
    (
        OK,
        "ok",
        "success: converged (`status`; `reload`, `reconcile` after their pass), a valid "
        "config (`check-config`), a plan that leaves nothing blocked (`plan`: changes "
        "to make are fine), nothing blocks RDMA (`doctor`), the unload may go ahead "
        "(`guard`). Attributes a driver refuses (unsupported-by-driver) are listed but "
        "count as converged",
    ),
    (
        FAIL,
        "failed",
        "not as declared: not converged (`status`, `reload`, `reconcile`: an object "
        "pending, blocked or degraded, a VF in use that drifted, passes that fail, an "
        "invalid config on disk while the last good one stays in force), a plan that "
        "leaves an object blocked or degraded (`plan`), something blocks RDMA "
        "(`doctor`), the unload is refused (`guard`); or the command failed (the kernel "
        "unreadable, an error or malformed answer, a file not written)",
    ),
    (
        USAGE,
        "usage",
        "usage error: bad arguments, or a `--root DIR` that is not a directory",
    ),
    (
        NOT_RUNNING,
        "not-running",
        "rdmad is not running (no socket, or nothing listens on it; also `rdmad plan "
        "--daemon`): it says what systemd says of `rdmad.service` (starting, restarting "
        "after a crash, stopped, failed) and what to do, or how to start it where systemd "
        "cannot be asked; `rdmad-ctl status` and `history` still show what the state "
        "file holds",
    ),
    (
        DENIED,
        "denied",
        "permission denied: reads need root or the API's read group (default "
        "`rdmad`, [api] read_group); reload, reconcile, pause and resume need root or "
        "[api] write_group",
    ),
    (
        NO_ANSWER,
        "no-answer",
        "rdmad listens but did not answer within --timeout: it is stuck (a liveness "
        "check treats 3 and 5 as dead, 0 and 1 as alive: the DaemonSet's probe does)",
    ),
    (
        CONFIG_INVALID,
        "config-invalid",
        "the config is invalid, every error listed as FILE:LINE: key: message "
        "(`rdmad check-config`, `rdmad plan`; `rdmad-ctl config`, and `rdmad-ctl "
        "reload`, where the daemon keeps the last good one)",
    ),
    (
        INTERRUPTED,
        "interrupted",
        "interrupted (Ctrl-C) during a one-shot command; `watch` exits 0 on Ctrl-C",
    ),
)

NAMES = {code: name for code, name, _ in TABLE}


def help_text(width: int = 78) -> str:
    """The table as ``--help`` and the man pages show it: ``  N  meaning``, wrapped."""
    lines = ["exit codes (rdmad and rdmad-ctl):"]
    for code, _, meaning in TABLE:
        lines += _wrap(f"{code:>3}  ", meaning.replace("`", ""), width)
    return "\n".join(lines) + "\n"


def markdown_table() -> str:
    """The table as README.md holds it (checked by a test, not generated into it)."""
    rows = ["| exit | JSON `error.code` | meaning |", "|---|---|---|"]
    rows += [f"| {code} | `{name}` | {meaning} |" for code, name, meaning in TABLE]
    return "\n".join(rows) + "\n"


def _wrap(first: str, text: str, width: int) -> list[str]:
    """Words into lines under ``first`` (textwrap costs rdmad-ctl start-up time)."""
    lines, line = [], first
    for word in text.split():
        if len(line) + 1 + len(word) > width and line.strip():
            lines.append(line.rstrip())
            line = " " * len(first)
        line += word + " "
    lines.append(line.rstrip())
    return lines


def error(code: int, message: str, **more: object) -> dict[str, object]:
    """The inner JSON error object: ``{"code": name, "exit": code, "message": ...}``
    and anything ``more`` (``errors``: a config's errors)."""
    return {"code": NAMES[code], "exit": code, "message": message, **more}


def error_doc(code: int, message: str, **more: object) -> dict[str, object]:
    """What a command prints on stdout with ``--json`` when it has nothing else to show."""
    return {"error": error(code, message, **more)}


def print_json(doc: object, out: TextIO | None = None) -> None:
    stream = sys.stdout if out is None else out
    json.dump(doc, stream, indent=2, default=str)
    stream.write("\n")


class Parser(argparse.ArgumentParser):
    """argparse's parser; a usage error also prints the JSON error object on stdout
    when ``--json`` is on the command line, so a script reading stdout always gets one.
    Sub-parsers made by ``add_subparsers`` are of this class too."""

    # The command line the top parser was given: sub-parsers see only their part.
    argv: list[str] = []

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> argparse.Namespace:
        Parser.argv = list(sys.argv[1:] if args is None else args)
        parsed: argparse.Namespace = super().parse_args(args, namespace)
        return parsed

    def error(self, message: str) -> None:  # type: ignore[override]
        argv = Parser.argv[: Parser.argv.index("--")] if "--" in Parser.argv else Parser.argv
        if "--json" in argv:
            print_json(error_doc(USAGE, f"{self.prog}: {message}"))
            sys.stdout.flush()
        super().error(message)  # usage and message on stderr, exit 2
