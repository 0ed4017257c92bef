"""Who asked: the process chain above the guard, for the journal and the pause.

Inside `modprobe -r igb` the guard's parent is the shell modprobe started for the
remove command, then modprobe, then whoever ran it; an override must name that
person, so the chain is walked a few steps up, with the uid and the login user
(``/proc/self/loginuid``, kept across sudo) when the kernel knows one.
"""

from __future__ import annotations

import os
import pwd

_STEPS = 4
_NO_LOGIN = 4294967295  # (uid_t)-1: no login session


def _stat(pid: int) -> tuple[str, int] | None:
    """(comm, parent pid) of a process, from /proc/PID/stat (comm may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    comm = text[text.find("(") + 1 : text.rfind(")")]
    rest = text[text.rfind(")") + 2 :].split()
    return comm, int(rest[1]) if len(rest) > 1 else 0


def describe_caller() -> str:
    chain = []
    pid = os.getppid()
    for _ in range(_STEPS):
        if pid <= 1:
            break
        info = _stat(pid)
        if info is None:
            break
        chain.append(f"{info[0]} (pid {pid})")
        pid = info[1]
    who = f"uid {os.getuid()}"
    try:
        with open("/proc/self/loginuid") as fh:
            login = int(fh.read().strip())
        if login != _NO_LOGIN:
            who += f", login {pwd.getpwuid(login).pw_name}"
    except (OSError, ValueError, KeyError):
        pass
    return f"{' <- '.join(chain) or 'unknown process'}, {who}"
