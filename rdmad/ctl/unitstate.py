"""Whether systemd will start rdmad again: asked when a `rdmad-ctl wait` loses the daemon.

A wait rides through a restart of rdmad (a crash and the unit's ``Restart=``, or
`systemctl restart`); after `systemctl stop rdmad`, or a crash systemd gives up on
(its start limit), nothing will converge, and the wait ends at once (exit 3) instead
of when ``--within`` ends. The daemon names its unit in its status (``daemon.unit``,
rdmad.api.ownunit); systemd answers with the unit's state and its queued job:

* ``inactive`` or ``failed`` with no job: stopped, and nothing will start it;
* ``activating``/``auto-restart`` (Restart='s wait), or any job queued (a restart is
  a stop job, then a start job): it comes back;
* ``deactivating``: a stop or a restart under way; the next look tells which.

Any doubt (no systemctl, no systemd, an unknown unit, no answer in time) is "it may
come back": the wait goes on as it would without this.
"""

from __future__ import annotations

SYSTEMCTL = "systemctl"
TIMEOUT = 5.0  # s: systemctl answers in milliseconds; a hung bus must not hold the wait
PROPERTIES = ("LoadState", "ActiveState", "SubState", "Job")


def stopped_for_good(unit: str) -> str | None:
    """Why ``unit`` will not run again unless someone starts it, or None (it may)."""
    import subprocess  # only when the daemon went away: the CLI's start stays lean

    argv = [SYSTEMCTL, "show", "--no-pager", *(f"--property={p}" for p in PROPERTIES)]
    try:
        done = subprocess.run(
            [*argv, "--", unit], capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return verdict(unit, done.stdout)


def verdict(unit: str, show: str) -> str | None:
    """``stopped_for_good`` from the text `systemctl show` printed."""
    props = dict(line.partition("=")[::2] for line in show.splitlines() if "=" in line)
    if props.get("LoadState") != "loaded" or props.get("Job", "?") != "":
        return None  # unknown to systemd, or a job queued (a systemd that hides jobs: doubt)
    state = props.get("ActiveState")
    if state == "inactive":
        return f"{unit} was stopped and nothing is starting it again"
    if state == "failed":
        return f"{unit} failed and systemd is not restarting it (journalctl -u {unit})"
    return None
