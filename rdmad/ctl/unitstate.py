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

When nothing answers on the socket at all (`rdmad-ctl status` while rdmad starts, or
while systemd waits ``RestartSec=`` after a crash), ``offline`` says what systemd says
of the packaged unit instead of "start it", and a `wait` asked then waits for it.
"""

from __future__ import annotations

SYSTEMCTL = "systemctl"
TIMEOUT = 5.0  # s: systemctl answers in milliseconds; a hung bus must not hold the wait
PROPERTIES = ("LoadState", "ActiveState", "SubState", "Job")


# The packaged unit: asked when no daemon answers (one that did would name its own).
UNIT = "rdmad.service"
OFFLINE_PROPERTIES = (*PROPERTIES, "Result", "NRestarts")


def show(unit: str, properties: tuple[str, ...] = PROPERTIES) -> str | None:
    """What `systemctl show` prints of these properties of ``unit``; None when systemd
    cannot be asked (no systemctl, not booted with systemd, no answer in time)."""
    import subprocess  # only when the daemon is away: the CLI's start stays lean

    argv = [SYSTEMCTL, "show", "--no-pager", *(f"--property={p}" for p in properties)]
    try:
        done = subprocess.run(
            [*argv, "--", unit], capture_output=True, text=True, timeout=TIMEOUT, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _props(text: str) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in text.splitlines() if "=" in line)


def stopped_for_good(unit: str) -> str | None:
    """Why ``unit`` will not run again unless someone starts it, or None (it may)."""
    text = show(unit)
    return None if text is None else verdict(unit, text)


def verdict(unit: str, show: str) -> str | None:
    """``stopped_for_good`` from the text `systemctl show` printed."""
    props = _props(show)
    if props.get("LoadState") != "loaded" or props.get("Job", "?") != "":
        return None  # unknown to systemd, or a job queued (a systemd that hides jobs: doubt)
    state = props.get("ActiveState")
    if state == "inactive":
        return f"{unit} was stopped and nothing is starting it again"
    if state == "failed":
        return f"{unit} failed and systemd is not restarting it (journalctl -u {unit})"
    return None


class Offline:
    """What systemd says of rdmad's unit while nothing answers on the API socket. (A
    plain class: `typing` for a NamedTuple would be rdmad-ctl's slowest import.)"""

    __slots__ = ("coming", "hint", "props", "says")

    def __init__(self, says: str, hint: str, coming: bool, props: dict[str, str]) -> None:
        self.says = says  # one line: the unit's state in words
        self.hint = hint  # what to do, or where to look
        self.coming = coming  # starting, or to be restarted: a wait may wait for it
        self.props = props  # the properties as systemd printed them (--json)

    @property
    def running(self) -> bool:
        """systemd has READY=1 from it. rdmad's API socket listens before it says so: no
        socket a moment before means it came up since, or it listens elsewhere."""
        return self.props.get("ActiveState") == "active"


def offline(unit: str = UNIT) -> Offline | None:
    """``describe`` of what systemd says now; None when it cannot be asked."""
    text = show(unit, OFFLINE_PROPERTIES)
    return None if text is None else describe(unit, text)


def describe(unit: str, show: str) -> Offline | None:
    """``offline`` from the text `systemctl show` printed; None for a unit systemd does
    not have (rdmad run by hand, in a container) or a state it has no words for here."""
    props = _props(show)
    if props.get("LoadState") != "loaded":
        return None
    active, sub, job = props.get("ActiveState"), props.get("SubState", ""), props.get("Job")
    result = props.get("Result") or "unknown"
    restarts = props.get("NRestarts") or "?"
    journal = f"journalctl -u {unit}"
    if sub == "auto-restart":
        says = f"{unit} failed ({result}) and systemd starts it again shortly (restart {restarts})"
        return Offline(says, f"why it failed: {journal}", True, props)
    if active in ("activating", "reloading") or (active == "inactive" and job):
        says = f"{unit} is starting ({sub or active}): the API answers once its imports are done"
        return Offline(says, "`rdmad-ctl wait` waits for it (--within S)", True, props)
    if active == "deactivating":  # a stop or a restart: the next look tells which
        return Offline(f"{unit} is stopping ({sub})", journal, True, props)
    if active == "failed":
        says = f"{unit} failed ({result}) and systemd is not restarting it"
        hint = f"why: {journal}; start it again: systemctl start {unit}"
        return Offline(says, hint, False, props)
    if active == "inactive":
        return Offline(f"{unit} is stopped", f"start it: systemctl start {unit}", False, props)
    if active == "active":
        says = f"{unit} is running, but not on this socket"
        hint = "--socket PATH: the daemon's [api] socket (`rdmad-ctl config` shows it)"
        return Offline(says, hint, False, props)
    return None
