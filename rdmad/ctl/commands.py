"""One function per rdmad-ctl command: ask the API, print text or JSON, return the
exit code (rdmad/exits.py). With ``--json`` a failure prints the JSON error object
(``{"error": {"code", "exit", "message"}}``) on stdout: beside what there still is to
show (the saved state when the daemon is down), or alone (``rdmad.ctl.run``).

Everything a command needs from outside (streams, the clock, colour, the boot id)
comes in a ``Ctx``, so tests run commands in-process against a fixture server
and compare their output exactly.
"""

from __future__ import annotations

import json
import os
import sys
import time

from rdmad import exits
from rdmad.ctl import offline, unitstate
from rdmad.ctl.client import (
    START_HINT,
    Client,
    ConnectionLost,
    NoAnswer,
    NotRunning,
    RequestFailed,
    Unavailable,
)
from rdmad.ctl.render.config import config_lines
from rdmad.ctl.render.formats import Style, printable, table, write_lines
from rdmad.ctl.render.history import event_line, history_rows
from rdmad.ctl.render.plan import plan_lines
from rdmad.ctl.render.saved import offline_lines
from rdmad.ctl.render.status import status_lines, trigger_lines
from rdmad.text import safe

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable
    from typing import Any, TextIO

WATCH_IDLE = 60.0  # the server sends a keepalive every 15 s: four missed means stuck
PLAN_WAIT = 10.0  # the server waits up to 10 s for the daemon's plan (docs/API.md)
# `wait`: the longest one request may be held by the daemon. Between two, a terminal
# gets a progress line; a daemon that stopped answering is found within one step.
WAIT_STEP = 5.0
WAIT_FLOOR = 0.25  # s: the least one look takes (a daemon that answers early never spins it)
WAIT_RESTART = 0.5  # s between asks while rdmad restarts (systemd's RestartSec= is 2 s)


class Ctx:
    """The outside world of one run."""

    def __init__(
        self,
        out: TextIO,
        err: TextIO,
        now: Callable[[], float] = time.time,
        colour: bool = False,
        width: int | None = None,
        boot_id: Callable[[], str] = offline.read_boot_id,
        progress: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out = out
        self.progress = progress  # stderr is a terminal: say what a long wait waits for
        self.clock = clock  # for durations (now is the wall clock, for times)
        self.err = err
        self.now = now
        self.style = Style(colour)
        self.width = width
        self.boot_id = boot_id

    @classmethod
    def real(cls) -> Ctx:
        tty = sys.stdout.isatty()
        colour = tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        width = None
        if tty:
            try:
                width = int(os.environ.get("COLUMNS", "0")) or os.get_terminal_size().columns
            except (ValueError, OSError):
                width = None
        # A terminal that reports no size (some ptys say 0) gets lines as they are.
        return cls(
            sys.stdout,
            sys.stderr,
            colour=colour,
            width=width if width else None,
            progress=sys.stderr.isatty(),
        )

    def print(self, lines: Iterable[str]) -> None:
        write_lines(lines, self.out.write)

    def json(self, doc: Any) -> None:
        json.dump(doc, self.out, indent=2)
        self.out.write("\n")

    def warn(self, text: str, *more: str) -> None:
        """One line (escaped: it often quotes the daemon or the system), then ``more``,
        lines of rdmad-ctl's own, indented."""
        self.err.write(f"rdmad-ctl: {safe(text)}\n")
        for line in more:
            self.err.write(f"  {line}\n")


def status(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    def ask() -> dict[str, Any]:
        return _doc(client.get("/v1/status"), "/v1/status", "objects", "converged")

    try:
        doc = ask()
    except NotRunning as exc:
        unit = unitstate.offline()
        if unit is None or not unit.running:
            return _status_offline(args, ctx, exc, unit)
        try:  # it came up between the two looks (see Offline.running): ask it once more
            doc = ask()
        except NotRunning:
            return _status_offline(args, ctx, exc, unit)
    if args.json:
        ctx.json(doc)
    else:
        ctx.print(status_lines(doc, ctx.now(), args.verbose, ctx.style, ctx.width))
    return exits.OK if doc["converged"] is True else exits.FAIL


def wait(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    """Until the daemon's verdict is converged (0), or ``--within`` seconds (1). Each
    request is held by the daemon until a pass converges the node or its step ends
    (``/v1/status?wait=``), so nothing polls.

    A request that gets no answer in time is asked again while ``--within`` lasts: right
    after READY=1 the socket takes connections before the daemon's web library is
    imported (seconds on a slow node at boot), and a unit waiting for RDMA must not fail
    for that. Only when the time is up with no answer at all does it exit 5.

    rdmad not running at the first ask exits 3 at once (start it first), unless systemd
    says its unit is starting or restarting it: then it is asked again as below. Once it
    has answered, a daemon that stops answering (it crashed and systemd's ``Restart=``
    brings it back in seconds, or it is restarting) is asked again while ``--within``
    lasts: exit 3 if it is still down then, or as soon as systemd says its unit was
    stopped and nothing starts it again (``systemctl stop rdmad``, a crash past the
    start limit; rdmad.ctl.unitstate). A deliberate stop also stops a unit that
    ``Requires=`` it, rdmad-wait-converged.service included."""
    started = ctx.clock()
    deadline = started + args.within
    doc: dict[str, Any] | None = None
    rechecked = False
    try:
        while True:
            asked = ctx.clock()
            step = min(max(0.0, deadline - asked), WAIT_STEP)
            query: dict[str, object] | None = {"wait": f"{step:.3f}"} if step > 0 else None
            try:
                doc = _doc(
                    client.get("/v1/status", query, wait=step),
                    "/v1/status",
                    "objects",
                    "converged",
                )
            except NoAnswer as exc:
                if ctx.clock() >= deadline:
                    if doc is None:
                        raise
                    break
                if ctx.progress:
                    ctx.warn(f"{exc}; asking again")
                time.sleep(max(0.0, WAIT_FLOOR - (ctx.clock() - asked)))  # never a spin
                continue
            except (NotRunning, Unavailable, ConnectionLost) as exc:
                if ctx.clock() >= deadline:
                    raise
                if doc is not None:
                    _unless_stopped_for_good(doc)
                    why = f"rdmad stopped answering ({exc}); asking again while it restarts"
                else:
                    # Down at the first ask: wait only while systemd says it is starting
                    # or will start it again (a crash inside RestartSec=, `systemctl
                    # start --no-block` just before); otherwise nothing will converge.
                    unit = unitstate.offline() if isinstance(exc, NotRunning) else None
                    if unit is not None and unit.running and not rechecked:
                        rechecked = True  # it came up since it was asked (Offline.running)
                        continue
                    if unit is None or not unit.coming:
                        raise
                    why = f"{exc}: {unit.says}; asking again"
                if ctx.progress:
                    ctx.warn(why)
                time.sleep(max(0.0, WAIT_RESTART - (ctx.clock() - asked)))
                continue
            if _converged_since_asked(doc) or ctx.clock() >= deadline:
                break
            time.sleep(max(0.0, min(step, WAIT_FLOOR) - (ctx.clock() - asked)))
            if ctx.progress:
                left = deadline - ctx.clock()
                ctx.warn(f"not converged yet ({left:.0f} s left): {doc.get('summary', '')}")
    except (NotRunning, Unavailable, ConnectionLost) as exc:
        # Down at the first ask, or gone while this waited and not back in time (its
        # 503 while it stopped): nothing will converge now.
        message = str(exc) if isinstance(exc, NotRunning) else f"rdmad stopped: {exc}"
        if doc is not None and not isinstance(exc, StoppedForGood):
            message = f"{message} (rdmad answered earlier, then was down until --within ended)"
        ctx.warn(message, *not_running_hints(exc, unitstate.UNIT if doc is None else _unit(doc)))
        if args.json:
            ctx.json(exits.error_doc(exits.NOT_RUNNING, message))
        return exits.NOT_RUNNING
    assert doc is not None  # the loop ends with an answer or raises
    waited = round(ctx.clock() - started, 3)
    converged = _converged_since_asked(doc)
    if args.json:
        ctx.json({**doc, "converged": converged, "waited": waited})
    elif converged:
        ctx.print([f"converged after {waited:.1f} s: {printable(doc.get('summary', ''))}"])
    else:
        older = ("no pass has ended since this asked (is one stuck?): the status is older",)
        ctx.warn(
            f"not converged within {args.within:g} s",
            *(older if doc.get("answered") is False else ()),
        )
        ctx.print(status_lines(doc, ctx.now(), False, ctx.style, ctx.width))
    return exits.OK if converged else exits.FAIL


class StoppedForGood(NotRunning):
    """systemd says rdmad's unit was stopped and nothing starts it again."""


def _unit(doc: dict[str, Any]) -> str | None:
    """The systemd unit rdmad said it runs as (``daemon.unit``), if any."""
    daemon = doc.get("daemon")
    unit = daemon.get("unit") if isinstance(daemon, dict) else None
    return unit if isinstance(unit, str) and unit else None


def _unless_stopped_for_good(doc: dict[str, Any]) -> None:
    """Raise StoppedForGood when the unit rdmad said it runs as will not come back."""
    unit = _unit(doc)
    if unit is not None:
        why = unitstate.stopped_for_good(unit)
        if why is not None:
            raise StoppedForGood(f"rdmad stopped: {why}")


def _converged_since_asked(doc: dict[str, Any]) -> bool:
    """The verdict is converged and comes from a pass that began after the request
    (``answered``; a daemon that predates it always answered with its last pass)."""
    return doc["converged"] is True and doc.get("answered") is not False


def not_running_hints(exc: Exception, unit: str | None = unitstate.UNIT) -> tuple[str, ...]:
    """The lines under "rdmad is not running": what systemd says of ``unit`` (the one
    the daemon named, else the packaged one; None: a daemon that runs outside systemd)
    and what to do then, where systemd can be asked; else how to start it."""
    if unit is None or isinstance(exc, StoppedForGood):
        return (START_HINT,)
    return _hints(unitstate.offline(unit))


def _hints(state: unitstate.Offline | None) -> tuple[str, ...]:
    """What systemd says of the unit and what to do then; how to start rdmad where
    systemd could not be asked."""
    return (START_HINT,) if state is None else (state.says, state.hint)


def _status_offline(
    args: argparse.Namespace, ctx: Ctx, exc: NotRunning, unit: unitstate.Offline | None
) -> int:
    ctx.warn(str(exc), *_hints(unit))
    state = offline.load(offline.state_path(args.state_dir), ctx.boot_id())
    if args.json:
        ctx.json(
            {
                "running": False,
                "socket": args.socket,
                "error": exits.error(exc.exit_code, str(exc)),
                "unit": None
                if unit is None
                else {"name": unitstate.UNIT, "says": unit.says, "systemd": unit.props},
                "state": state,
            }
        )
    else:
        ctx.print(offline_lines(state, ctx.now()))
    return exits.NOT_RUNNING


def plan(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    client.timeout = max(client.timeout, PLAN_WAIT + 5)
    doc = _doc(client.get("/v1/plan"), "/v1/plan", "actions", "objects")
    if args.json:
        ctx.json(doc)
    else:
        ctx.print(plan_lines(doc, ctx.now(), f"asked on {args.socket}"))
    return plan_exit(doc["objects"])


def plan_exit(objects: list[dict[str, Any]]) -> int:
    """0 when the plan reaches the declared state (changes to make are fine), 1 when it
    leaves an object blocked or degraded: the same rule for `rdmad plan` and this."""
    stuck = any(o.get("state") in ("blocked", "degraded") for o in objects)
    return exits.FAIL if stuck else exits.OK


def history(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    since = None if args.since is None else args.since.at(ctx.now())
    query: dict[str, object] = {"obj": _object(args), "since": since, "limit": args.limit}
    try:
        doc = _doc(client.get("/v1/history", query), "/v1/history", "entries")
    except NotRunning as exc:
        return _history_offline(args, ctx, exc)
    if args.json:
        ctx.json(doc)
    else:
        _print_history(ctx, doc["entries"])
    return exits.OK


def _history_offline(args: argparse.Namespace, ctx: Ctx, exc: NotRunning) -> int:
    """The state file keeps the newest 200 entries: filter them as the API would."""
    state = offline.load(offline.state_path(args.state_dir), ctx.boot_id())
    since = None if args.since is None else args.since.at(ctx.now())
    obj = _object(args)
    entries = [
        e
        for e in state["history"]
        if (obj is None or e.get("obj") == obj) and (since is None or _at(e) >= since)
    ][-(args.limit or 200) :]
    ctx.warn(str(exc), *not_running_hints(exc))
    if args.json:
        ctx.json(
            {
                "running": False,
                "error": exits.error(exc.exit_code, str(exc)),
                "file": state["file"],
                "problem": state["problem"],
                "entries": entries,
            }
        )
    elif not state["readable"]:
        ctx.print([f"No saved history to show: {state['problem']}"])
    else:
        ctx.print([f"From the saved state {state['file']}:"])
        _print_history(ctx, entries)
    return exits.NOT_RUNNING


def _object(args: argparse.Namespace) -> str | None:
    """The object named by one argument or by its words ("sriov", "pci=...")."""
    return " ".join(args.object) if args.object else None


def _at(entry: dict[str, Any]) -> float:
    at = entry.get("at")
    return float(at) if isinstance(at, int | float) else 0.0


def _print_history(ctx: Ctx, entries: list[dict[str, Any]]) -> None:
    if not entries:
        ctx.print(["No history entries match."])
        return
    ctx.print(table(history_rows(entries), ctx.style, state_col=1))


def watch(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    try:
        for event, data in client.events(WATCH_IDLE):
            if args.json:
                try:
                    parsed: Any = json.loads(data)
                except ValueError:
                    parsed = data
                line = json.dumps({"event": event, "data": parsed})
            else:
                line = event_line(event, data, ctx.now(), ctx.style)
            ctx.out.write(line + "\n")
            ctx.out.flush()  # a line as it happens, also into a pipe
    except KeyboardInterrupt:
        return exits.OK
    why = "rdmad closed the event stream (it stopped or restarted, or this reader fell behind)"
    ctx.warn(why)
    if args.json:  # one JSON object a line, the last one says why the stream ended
        ctx.out.write(json.dumps(exits.error_doc(exits.FAIL, why)) + "\n")
    return exits.FAIL


def reload(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    return _trigger("reload", args, ctx, client)


def reconcile(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    return _trigger("reconcile", args, ctx, client)


def _trigger(what: str, args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    target = f"/v1/{what}"
    doc = _doc(client.post(target, {"wait": f"{args.wait:g}"}, wait=args.wait), target)
    rejected = None
    if what == "reload" and doc.get("pass") is not None:
        rejected = _config_rejected(ctx, client)
        if rejected is not None:
            doc = {**doc, "error": rejected}
    if args.json:
        ctx.json(doc)
    else:
        ctx.print(trigger_lines(what, doc, args.wait))
    if doc.get("pass") is None:
        return exits.OK if args.wait <= 0 else exits.FAIL
    if rejected is not None:
        return exits.CONFIG_INVALID
    return exits.OK if doc.get("converged") is True else exits.FAIL


def _config_rejected(ctx: Ctx, client: Client) -> dict[str, object] | None:
    """After a reload: did the daemon refuse the files? The answer's summary only hints
    at it; the status lists the errors (a script's `reload || ...` must see them). The
    JSON error object when it did (the errors on stderr too), else None."""
    daemon = _doc(_doc(client.get("/v1/status"), "/v1/status", "daemon")["daemon"], "/v1/status")
    errors = [str(e) for e in daemon.get("config_errors") or []]
    if not errors:
        return None
    kept = "the last good config is kept" if daemon.get("config_ok") else "nothing managed"
    message = f"the config is invalid ({len(errors)} error(s)); {kept}"
    ctx.warn(f"{message}:")
    for error in errors:
        ctx.err.write(f"  {safe(error)}\n")
    return exits.error(exits.CONFIG_INVALID, message, errors=errors)


def snapshot(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    doc = _doc(client.get("/v1/snapshot"), "/v1/snapshot", "toml")
    text = doc["toml"]
    if not isinstance(text, str):
        raise RequestFailed("rdmad's /v1/snapshot answer has no TOML text")
    if args.output:
        try:
            _write_atomic(args.output, text)
        except OSError as exc:
            raise RequestFailed(f"cannot write {args.output}: {exc.strerror or exc}") from None
        ctx.err.write(f"wrote {args.output}\n")
    if args.json:
        ctx.json(doc)
    elif not args.output:
        ctx.out.write(text if text.endswith("\n") or not text else text + "\n")
    return exits.OK


def _write_atomic(path: str, text: str) -> None:
    """The whole file or the old one: a temp file beside it, fsync, rename."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def config(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    doc = _doc(client.get("/v1/config"), "/v1/config", "files", "values")
    invalid = doc.get("ok", True) is not True or bool(doc.get("errors"))
    if args.json:
        if invalid:
            why = f"the config is invalid ({len(doc.get('errors') or [])} error(s))"
            doc = {**doc, "error": exits.error(exits.CONFIG_INVALID, why)}
        ctx.json(doc)
    else:
        ctx.print(config_lines(doc))
    return exits.CONFIG_INVALID if invalid else exits.OK


def guard(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    """The guard's own check (it needs no daemon): its exit code is the answer."""
    from rdmad.guard.cli import main as guard_main

    ctx.out.flush()
    argv = [args.action, args.target] + ["--json"] * args.json + ["--force"] * args.force
    return guard_main(argv)


def pause(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    body: dict[str, object] = {"seconds": args.seconds, "reason": args.reason}
    doc = _doc(client.post("/v1/pause", {"wait": "10"}, wait=10.0, body=body), "/v1/pause")
    return _paused(args, ctx, client, doc, "pause")


def resume(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    doc = _doc(client.post("/v1/pause", {"wait": "10"}, wait=10.0, method="DELETE"), "/v1/pause")
    return _paused(args, ctx, client, doc, "resume")


def _paused(args: argparse.Namespace, ctx: Ctx, client: Client, doc: Any, what: str) -> int:
    status = _doc(client.get("/v1/status"), "/v1/status", "daemon")
    pause_doc = status["daemon"].get("pause")
    if args.json:
        ctx.json({**doc, "pause": pause_doc})
    elif pause_doc:
        ctx.print([f"{what}: {printable(pause_doc.get('describe'))}"])
    else:
        ctx.print([f"{what}: not paused; rdmad restores what was held back"])
    return exits.OK


def doctor(args: argparse.Namespace, ctx: Ctx, client: Client) -> int:
    """Read-only checks of this node; the daemon is not asked (``client`` unused)."""
    from rdmad.doctor import Root, run_checks  # standard library only, like this module

    if not os.path.isdir(args.root):
        ctx.warn(f"--root {args.root}: not a directory")
        if args.json:
            ctx.json(exits.error_doc(exits.USAGE, f"--root {args.root}: not a directory"))
        return exits.USAGE
    devlink = None
    if os.path.realpath(args.root) == "/":
        # devlink (the eSwitch modes) answers about this host only, not about a tree.
        from rdmad.doctor.devlink import HostDevlink

        devlink = HostDevlink()
    try:
        report = run_checks(Root(args.root), args.config, devlink)
    finally:
        if devlink is not None:
            devlink.close()
    if args.json:
        ctx.json(report.to_json())
    else:
        ctx.print(report.lines())
    return report.exit_code()


COMMANDS: dict[str, Callable[[argparse.Namespace, Ctx, Client], int]] = {
    "status": status,
    "plan": plan,
    "history": history,
    "wait": wait,
    "watch": watch,
    "reload": reload,
    "reconcile": reconcile,
    "snapshot": snapshot,
    "config": config,
    "guard": guard,
    "pause": pause,
    "resume": resume,
    "doctor": doctor,
}


def _doc(doc: Any, target: str, *keys: str) -> dict[str, Any]:
    """The answer, if it is an object with ``keys``; else a clear failure (the daemon
    and rdmad-ctl disagree on docs/API.md)."""
    if not isinstance(doc, dict):
        raise RequestFailed(f"rdmad's answer to {target} is not a JSON object")
    missing = [k for k in keys if k not in doc]
    if missing:
        raise RequestFailed(
            f"rdmad's answer to {target} lacks {', '.join(missing)} (API version "
            f"{doc.get('api')!r}; is rdmad-ctl the same version as the daemon?)"
        )
    return doc
