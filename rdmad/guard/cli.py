"""The guard's command line (``python -I -m rdmad.guard``, ``rdmad-ctl guard``).

    check TARGET [--json] [--force]   decide for a module, driver or PCI address; change nothing
    remove MODULE                     the modprobe.d ``remove`` command: decide, pause rdmad,
                                      unload (``modprobe -r --ignore-remove``), resume if it failed
    hook MODULE                       the command of hook files older rdmad wrote (`... hook M &&
                                      exec modprobe -r ...`): decide, pause rdmad if M is loaded
    stack-stop [--by NAME]            the openibd drop-in: every module the hook guards, then pause
    stack-stopped [--by NAME]         after it (ExecStopPost=): resume if ib_core is still loaded

Exit 0: allowed (or forced), 1: refused, 2: the target names nothing / usage error;
``remove``: modprobe's own exit status once allowed.

A refusal goes to stderr (modprobe shows it above its own "Error running remove
command") and to the journal; so does every override. Force with ``--force`` or
``RDMAD_GUARD_FORCE=1`` in the environment of `modprobe -r` (modprobe passes its
environment to the remove command). The decision has a hard deadline
(``RDMAD_GUARD_DEADLINE`` seconds, default 20): past it, or on any internal error,
the guard refuses and says why, unless forced. It never hangs a `modprobe -r`.

An allowed ``remove``/``stack-stop`` writes the pause file first (``rdmad.kernel.pause``):
the daemon then loads no module and creates no rxe link until the stack is back. Only
when the unload really goes ahead: nothing is paused for a module that is not loaded
(or built in), nor for a stack stop with nothing of the stack loaded. ``remove`` runs
the unload itself, so it knows how it ended: the same module still loaded after
modprobe returned (refused by the kernel, in use, a driver that failed to unbind) ends
the pause at once, saying why, instead of rdmad standing back for two minutes for
nothing. (The alternative, the daemon voiding a pause whose module is still loaded
after some bound, would guess: a PF driver unbinding 100 VFs takes a minute, and a
slow unload would get rdmad loading modules in the middle of it.) A stack stop is run
by openibd, not by the guard: ``stack-stopped`` after it ends the pause when the RDMA
core was never unloaded.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import syslog
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import FrameType
from typing import TextIO

from rdmad.exits import error_doc, print_json
from rdmad.guard.caller import describe_caller
from rdmad.guard.decide import FORCE_HINT, Decision, TargetError, decide
from rdmad.kernel.guardhook import HOOK_FILE, MODPROBE, guarded_modules
from rdmad.kernel.pause import (
    DEFAULT_PAUSE,
    end_pause,
    module_identity,
    pause_identity,
    read_pause,
    write_pause,
)
from rdmad.kernel.sysfs import Sysfs
from rdmad.kernel.sysfs_files import Unreadable
from rdmad.model.shared_observed import PauseObserved, RdmaLinkObserved
from rdmad.text import safe, safe_lines

DEFAULT_DEADLINE = 20.0  # a cold python under QEMU/TCG takes seconds; a real node, ~0.1 s
EXIT_ALLOWED, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2
STACK_CORE = "ib_core"  # a stack stop is over once the RDMA core is loaded again


class _Deadline(Exception):
    pass


def _on_alarm(_signum: int, _frame: FrameType | None) -> None:
    raise _Deadline


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rdmad-guard",
        description="Refuse to unload a PF driver (or rdma_rxe) while its VFs or links are in use.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="decide for a module, driver or PCI address")
    check.add_argument("target", help="module or driver name (igb, mlx5_core) or PCI address")
    check.add_argument("--json", action="store_true", help="print the decision as JSON")
    check.add_argument("--force", action="store_true", help="allow even when in use (logged)")
    remove = sub.add_parser(
        "remove",
        help="the modprobe.d remove command: decide, pause rdmad, unload, resume on failure",
    )
    remove.add_argument("module")
    hook = sub.add_parser("hook", help="the remove command of older hook files (decide, pause)")
    hook.add_argument("module")
    stack = sub.add_parser("stack-stop", help="before an RDMA stack stop (openibd)")
    stack.add_argument("--by", default="a stack stop", help="who stops the stack")
    stack.add_argument("--json", action="store_true")
    stack.add_argument("--force", action="store_true")
    stopped = sub.add_parser("stack-stopped", help="after a stack stop: resume if it failed")
    stopped.add_argument("--by", default="a stack stop", help="who stopped the stack")
    return p


Unload = Callable[[str], int]


def modprobe_remove(module: str) -> int:
    """``modprobe -r --ignore-remove MODULE`` (not this hook again), its output the
    caller's; its exit status. Like system(3), SIGINT and SIGQUIT are the child's
    alone while it runs: a Ctrl-C must not leave rdmad paused with nothing unloaded.
    (Caught, not ignored: an ignored signal would stay ignored in modprobe.)"""
    import subprocess

    signals = (signal.SIGINT, signal.SIGQUIT)
    saved = [(s, signal.signal(s, _child_only)) for s in signals]
    try:
        return subprocess.call([MODPROBE, "-r", "--ignore-remove", module])
    except OSError as exc:
        _say(f"rdmad-guard: cannot run {MODPROBE}: {exc.strerror or exc}")
        return EXIT_REFUSED
    finally:
        for sig, handler in saved:
            signal.signal(sig, handler)


def _child_only(_signum: int, _frame: FrameType | None) -> None:
    """A terminal's Ctrl-C while modprobe runs: modprobe's to act on; the guard waits."""


def main(
    argv: Sequence[str] | None = None, *, root: str = "/", unload: Unload = modprobe_remove
) -> int:
    args = _parser().parse_args(argv)
    sysfs = Sysfs(root)
    if args.command == "stack-stopped":
        return _stack_stopped(sysfs, args.by)
    verdict, decisions = _verdict(args, sysfs)
    if verdict != EXIT_ALLOWED or args.command == "check":
        return verdict
    if args.command == "stack-stop":
        if any(d.modules for d in decisions) or _loaded(sysfs, STACK_CORE) is not None:
            _pause(sysfs, args, decisions)
        return EXIT_ALLOWED
    module = args.module
    loaded = _loaded(sysfs, module)
    pause = _pause(sysfs, args, decisions) if loaded is not None else None
    if args.command == "hook":
        return EXIT_ALLOWED  # the hook line itself runs modprobe -r next
    status = unload(module)
    if pause is not None and _loaded(sysfs, module) == loaded:
        why = f"the unload of {module} failed (modprobe exit {status}): {module} is still loaded"
        _resume(sysfs, pause, why)
    return status


def _verdict(args: argparse.Namespace, sysfs: Sysfs) -> tuple[int, list[Decision]]:
    """Decide (bounded), say it (stderr, stdout, journal); the exit code and decisions."""
    forced = getattr(args, "force", False) or os.environ.get("RDMAD_GUARD_FORCE", "") not in (
        "",
        "0",
    )
    deadline = _deadline()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    try:
        if args.command == "stack-stop":
            targets = sorted(m for m in _hooked(sysfs) if sysfs.exists(f"sys/module/{m}"))
        elif args.command in ("hook", "remove"):
            targets = [args.module]
        else:
            targets = [args.target]
        decisions = _decide_all(sysfs, targets)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except TargetError as exc:
        _say(f"rdmad-guard: {exc}")
        if getattr(args, "json", False):  # a script reading stdout gets an answer too
            print_json(error_doc(EXIT_USAGE, f"rdmad-guard: {exc}"))
        return EXIT_USAGE, []
    except _Deadline:
        why = f"no decision within {deadline:g} s (RDMAD_GUARD_DEADLINE)"
        return _failed(args, targets_of(args), why, forced), []
    except Exception as exc:  # an internal error must refuse, never crash modprobe silently
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return _failed(args, targets_of(args), f"internal error: {detail}", forced), []
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    allowed = all(d.allowed for d in decisions)
    if getattr(args, "json", False):
        _print_decision(allowed, forced, decisions)
    what = _what(args, targets_of(args))
    if not allowed:
        text = "\n".join(d.explain() for d in decisions if not d.allowed)
        if not forced:
            _journal(syslog.LOG_WARNING, f"refused {what}: {_one_line(decisions)}")
            if not getattr(args, "json", False):
                _say(f"rdmad-guard: {text}")
            return EXIT_REFUSED, decisions
        _journal(syslog.LOG_WARNING, f"FORCED {what} although in use: {_one_line(decisions)}")
        _say(f"rdmad-guard: forced (RDMAD_GUARD_FORCE): {text}")
    elif args.command == "check" and not args.json:
        _say("\n".join(d.explain() for d in decisions), sys.stdout)
    return EXIT_ALLOWED, decisions


def _loaded(sysfs: Sysfs, module: str) -> int | None:
    """The identity of a loaded module that an unload can take away (``module_identity``),
    None when it is not loaded, or built in (modprobe -r refuses a built-in)."""
    name = module.replace("-", "_")
    if sysfs.read(f"sys/module/{name}/initstate") is None:
        return None  # not loaded, or built in (no initstate)
    return module_identity(sysfs, name)


def _print_decision(allowed: bool, forced: bool, decisions: list[Decision], **more: object) -> None:
    """``--json``'s decision document: the unload may go ahead when allowed or forced;
    ``forced`` only where the force was what let it (``more``: ``undecided``)."""
    print_json(
        {
            "allowed": allowed or forced,
            "forced": forced and not allowed,
            "decisions": [d.to_json() for d in decisions],
            **more,
        }
    )


def targets_of(args: argparse.Namespace) -> list[str]:
    if args.command in ("hook", "remove"):
        return [args.module]
    if args.command == "check":
        return [args.target]
    return ["the RDMA stack"]


def _what(args: argparse.Namespace, targets: list[str]) -> str:
    who = describe_caller()
    if args.command in ("hook", "remove"):
        return f"`modprobe -r {targets[0]}` by {who}"
    if args.command == "stack-stop":
        return f"stack stop ({args.by}) by {who}"
    return f"check {targets[0]} by {who}"


def _deadline() -> float:
    try:
        value = float(os.environ.get("RDMAD_GUARD_DEADLINE", DEFAULT_DEADLINE))
    except ValueError:
        value = DEFAULT_DEADLINE
    return max(0.1, value)


def _hooked(sysfs: Sysfs) -> frozenset[str]:
    return guarded_modules(sysfs.read(HOOK_FILE) or "")


def _decide_all(sysfs: Sysfs, targets: list[str]) -> list[Decision]:
    unknown = None
    try:
        links, note = _rdma_links(sysfs)
    except Unreadable as exc:  # no RDMA device could be listed: each decision holds
        links, note, unknown = [], None, exc.reason
    return [decide(sysfs, t, links, rdma_note=note, rdma_unknown=unknown) for t in targets]


def _rdma_links(sysfs: Sysfs) -> tuple[list[RdmaLinkObserved], str | None]:
    """RDMA links with their kernel users; only when ib_core is loaded (opening the
    socket would load it). Unreadable: links from sysfs, their usage unknown; raises
    ``Unreadable`` when sysfs cannot list them either."""
    if not sysfs.exists("sys/module/ib_core"):
        return [], None
    from rdmad.kernel.usage.holders import OpenFiles, rdma_links_from_sysfs

    if os.path.realpath(sysfs.root) != "/":  # a tree (tests): no netlink into it
        return list(rdma_links_from_sysfs(sysfs, OpenFiles())), None
    from rdmad import nossl

    nossl.defer()  # before asyncio: the guard speaks no TLS (rdmad.nossl)
    import asyncio  # only here: ~60 ms that a node without RDMA never pays

    from rdmad.kernel.errors import KernelError
    from rdmad.kernel.netlink.rdma import RdmaNetlink
    from rdmad.model.shared_observed import Usage, Use

    async def read() -> list[RdmaLinkObserved]:
        nl = RdmaNetlink(root=sysfs.root)
        try:
            return await nl.links()
        finally:
            nl.close()

    try:
        links = asyncio.run(read())
    except (KernelError, OSError) as exc:
        why = f"RDMA users could not be read ({exc}): every RDMA link counts as in use"
        unknown = Usage(Use.UNKNOWN, (why,))
        return [replace(r, usage=unknown) for r in rdma_links_from_sysfs(sysfs, OpenFiles())], why
    # Without ib_uverbs loaded netlink does not name the driver: sysfs does (rxe: "parent").
    return [replace(r, driver=r.driver or sysfs.ib_driver(r.name)) for r in links], None


def _pause(
    sysfs: Sysfs, args: argparse.Namespace, decisions: list[Decision]
) -> PauseObserved | None:
    modules = sorted({m for d in decisions for m in d.modules} | {STACK_CORE})
    if args.command in ("hook", "remove"):
        modules = sorted(set(modules) | {args.module.replace("-", "_")})
        by = f"`modprobe -r {args.module}` ({describe_caller()})"
    else:
        by = f"{args.by} ({describe_caller()})"
    try:
        pause = write_pause(
            sysfs,
            by=by,
            reason="guarded stop of the RDMA stack",
            seconds=DEFAULT_PAUSE,
            modules=modules,
            now=time.time(),
        )
    except OSError as exc:  # rdmad may bring a module back early: say so, do not refuse
        _say(f"rdmad-guard: could not pause rdmad ({exc}); it may reload modules")
        return None
    _journal(syslog.LOG_INFO, f"allowed; rdmad stands back: {pause.describe()}")
    return pause


def _resume(sysfs: Sysfs, pause: PauseObserved | None, why: str) -> None:
    """End ``pause`` (only that one; None: the pause in force) now, saying why."""
    try:
        ended = end_pause(sysfs, why=why, now=time.time(), only=pause)
    except OSError as exc:
        _say(f"rdmad-guard: {why}; rdmad stays paused ({exc})")
        return
    if ended is not None:
        _journal(syslog.LOG_INFO, f"{why}: rdmad no longer stands back ({ended.describe()})")
        _say(f"rdmad-guard: {why}: rdmad no longer stands back")


def _stack_stopped(sysfs: Sysfs, by: str) -> int:
    """After a stack stop (openibd's ExecStopPost=): a pause that began while the RDMA
    core was loaded, with that same core still loaded, is over; the stop failed."""
    pause = read_pause(sysfs, time.time())
    if pause is None or not pause.by.startswith(f"{by} (") or STACK_CORE not in pause.modules:
        return EXIT_ALLOWED  # none, or not this stop's (e.g. `rdmad-ctl pause`)
    began_with = pause_identity(sysfs, STACK_CORE)
    if began_with is not None and began_with == _loaded(sysfs, STACK_CORE):
        _resume(sysfs, pause, f"{by} left {STACK_CORE} loaded: the stack was not stopped")
    return EXIT_ALLOWED


def _failed(args: argparse.Namespace, targets: list[str], why: str, forced: bool) -> int:
    """No decision (the deadline, an internal error): refused unless forced. With
    ``--json`` the decision document says so (``undecided``), with no decisions."""
    what = _what(args, targets)
    if getattr(args, "json", False):
        _print_decision(False, forced, [], undecided=why)
    if forced:
        _journal(syslog.LOG_WARNING, f"FORCED {what}; the guard could not decide: {why}")
        _say(f"rdmad-guard: forced although the guard could not decide: {safe(why)}")
        return EXIT_ALLOWED
    _journal(syslog.LOG_WARNING, f"refused {what}: the guard could not decide: {why}")
    _say(f"rdmad-guard: refused: the guard could not decide: {safe(why)}\n  {FORCE_HINT}")
    return EXIT_REFUSED


def _one_line(decisions: list[Decision]) -> str:
    return (
        "; ".join(f"{h.what}: {h.usage.describe()}" for d in decisions for h in d.held)
        or "nothing in use"
    )


def _say(text: str, stream: TextIO | None = None) -> None:
    """Lines for the person at `modprobe -r` (stderr unless told): holders' names and
    command lines are anyone's to choose, so each line is escaped (rdmad.text)."""
    print(safe_lines(text), file=stream or sys.stderr)


def _journal(priority: int, message: str) -> None:
    """One line to the journal (syslog socket); silent where there is none (a container).
    Escaped whole: a newline in a holder's name must not forge a second entry."""
    try:
        syslog.openlog("rdmad-guard", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(priority, safe(message))
        syslog.closelog()
    except OSError:
        pass
