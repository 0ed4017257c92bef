"""The systemd unit this daemon runs as, named in the status document (``daemon.unit``).

`rdmad-ctl wait` rides through a restart of rdmad; when the daemon stops answering, it
asks systemd about this unit to tell a restart (wait on) from `systemctl stop` or a
crash systemd will not restart (nothing will converge: exit 3 at once, not when
``--within`` ends). Read once, when the API starts.

systemd puts ``INVOCATION_ID`` in the environment of every unit it starts, and the unit
is the last part of the process's cgroup path: cgroup v2's ``0::/system.slice/rdmad.service``,
or the ``name=systemd`` hierarchy of v1 (EL 8). Not started by systemd (a shell, a
container of the DaemonSet, the tests): None, and the wait keeps asking as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

CGROUP = "/proc/self/cgroup"


def own_unit(environ: Mapping[str, str] = os.environ, cgroup: str = CGROUP) -> str | None:
    if not environ.get("INVOCATION_ID"):
        return None
    try:
        with open(cgroup) as fh:
            text = fh.read()
    except OSError:
        return None
    return unit_of(text)


def unit_of(cgroup_text: str) -> str | None:
    """The service a /proc/PID/cgroup text places the process in; None: no service."""
    for line in cgroup_text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (hierarchy == "0" and controllers == "") or "name=systemd" in controllers.split(","):
            last = path.rstrip("/").rsplit("/", 1)[-1]
            if last.endswith(".service"):
                return last
    return None
