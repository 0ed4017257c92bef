"""Where the daemon listens and keeps its state, as rdmad-ctl finds them.

In this order, the first that says: the command line (``--socket``, ``--state-dir``),
``$RDMAD_SOCKET`` (the socket only), the daemon's own config (``[api] socket``,
``[daemon] state_dir``, read from ``--config``, default /etc/rdmad, merged key by key as
the daemon merges them), the defaults. So a node whose config moves the socket needs no
flag on every call. The config is read only when a value is not given otherwise, and
with the standard library only (rdmad-ctl starts fast; rdmad.tomlfiles).

A config that cannot be read is said on stderr once, and the defaults are used: never a
guess from part of it (a later drop-in could have set the value). A config directory
that does not exist is not worth a word (the defaults are the daemon's own).
"""

from __future__ import annotations

import os

from rdmad.ctl.client import DEFAULT_SOCKET
from rdmad.ctl.offline import DEFAULT_STATE_DIR
from rdmad.pathkeys import path_problem, socket_path_problem

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

DEFAULT_CONFIG = "/etc/rdmad"

# (section, key) in the config -> the argument it fills
FROM_CONFIG = {("api", "socket"): "socket", ("daemon", "state_dir"): "state_dir"}
# Commands that ask neither the daemon nor its state file: the config is not read for
# them (the doctor reads it itself, and says what is wrong with it).
OWN_WAY = frozenset({"doctor", "guard"})


def resolve(args: Any, environ: Mapping[str, str], warn: Callable[[str], None]) -> None:
    """Fill ``args.socket`` and ``args.state_dir`` where the command line left them None."""
    if args.command in OWN_WAY:
        args.socket = args.socket or DEFAULT_SOCKET
        args.state_dir = args.state_dir or DEFAULT_STATE_DIR
        return
    if args.socket is None and environ.get("RDMAD_SOCKET"):
        args.socket = environ["RDMAD_SOCKET"]
    wanted = [arg for arg in FROM_CONFIG.values() if getattr(args, arg) is None]
    if wanted:
        found = _from_config(args.config, warn)
        for arg in wanted:
            setattr(args, arg, found.get(arg))
    if args.socket is None:
        args.socket = DEFAULT_SOCKET
    if args.state_dir is None:
        args.state_dir = DEFAULT_STATE_DIR


def _from_config(where: str, warn: Callable[[str], None]) -> dict[str, str]:
    from rdmad.tomlfiles import read_documents

    if not os.path.lexists(where):
        if where != DEFAULT_CONFIG:
            warn(f"no config at {where}: the socket and state directory are the defaults")
        return {}
    docs, note = read_documents(where)
    if note is not None:
        warn(f"cannot read the config ({note}): the socket and state directory are the defaults")
        return {}
    found: dict[str, str] = {}
    for _, doc in docs:
        for (section, key), arg in FROM_CONFIG.items():
            table = doc.get(section)
            value = table.get(key) if isinstance(table, dict) else None
            if isinstance(value, str) and value:
                found[arg] = value
    # The value the files leave, checked as the daemon checks it: one it would refuse
    # (and run with the default instead) is not used here either.
    for (section, key), arg in FROM_CONFIG.items():
        problem = _PROBLEM[arg](found[arg]) if arg in found else None
        if problem is not None:
            why = f"[{section}] {key} in the config is invalid ({problem})"
            warn(f"{why}: using the default, as rdmad does")
            del found[arg]
    return found


# Each key by the rule the daemon checks it with (rdmad.pathkeys).
_PROBLEM = {"socket": socket_path_problem, "state_dir": path_problem}
