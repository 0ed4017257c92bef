"""The guard's command line (``python -I -m rdmad.guard``, ``rdmad-ctl guard``).

    check TARGET [--json] [--force]   decide for a module, driver or PCI address; change nothing
    hook MODULE                       the modprobe.d ``remove`` command: decide, then pause rdmad
    stack-stop [--by NAME]            the openibd drop-in: every module the hook guards, then pause

Exit 0: allowed (or forced), 1: refused, 2: the target names nothing / usage error.

A refusal goes to stderr (modprobe shows it above its own "Error running remove
command") and to the journal; so does every override. Force with ``--force`` or
``RDMAD_GUARD_FORCE=1`` in the environment of `modprobe -r` (modprobe passes its
environment to the remove command). The decision has a hard deadline
(``RDMAD_GUARD_DEADLINE`` seconds, default 20): past it, or on any internal error,
the guard refuses and says why, unless forced. It never hangs a `modprobe -r`.

An allowed ``hook``/``stack-stop`` writes the pause file first (``rdmad.kernel.pause``):
the daemon then loads no module and creates no rxe link until the stack is back.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import syslog
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from types import FrameType

from rdmad.guard.caller import describe_caller
from rdmad.guard.decide import FORCE_HINT, Decision, TargetError, decide
from rdmad.kernel.guardhook import HOOK_FILE, guarded_modules
from rdmad.kernel.pause import DEFAULT_PAUSE, write_pause
from rdmad.kernel.sysfs import Sysfs, Unreadable
from rdmad.model.observed import RdmaLinkObserved

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
    hook = sub.add_parser("hook", help="the modprobe.d remove command (then rdmad stands back)")
    hook.add_argument("module")
    stack = sub.add_parser("stack-stop", help="before an RDMA stack stop (openibd)")
    stack.add_argument("--by", default="a stack stop", help="who stops the stack")
    stack.add_argument("--json", action="store_true")
    stack.add_argument("--force", action="store_true")
    return p


def main(argv: Sequence[str] | None = None, *, root: str = "/") -> int:
    args = _parser().parse_args(argv)
    forced = getattr(args, "force", False) or os.environ.get("RDMAD_GUARD_FORCE", "") not in (
        "",
        "0",
    )
    sysfs = Sysfs(root)
    deadline = _deadline()
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    try:
        if args.command == "stack-stop":
            targets = sorted(m for m in _hooked(sysfs) if sysfs.exists(f"sys/module/{m}"))
        elif args.command == "hook":
            targets = [args.module]
        else:
            targets = [args.target]
        decisions = _decide_all(sysfs, targets)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except TargetError as exc:
        print(f"rdmad-guard: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _Deadline:
        why = f"no decision within {deadline:g} s (RDMAD_GUARD_DEADLINE)"
        return _failed(args, targets_of(args), why, forced)
    except Exception as exc:  # an internal error must refuse, never crash modprobe silently
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return _failed(args, targets_of(args), f"internal error: {detail}", forced)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    allowed = all(d.allowed for d in decisions)
    if getattr(args, "json", False):
        doc = {"allowed": allowed or forced, "forced": forced and not allowed}
        doc["decisions"] = [d.to_json() for d in decisions]
        print(json.dumps(doc, indent=2))
    what = _what(args, targets_of(args))
    if not allowed:
        text = "\n".join(d.explain() for d in decisions if not d.allowed)
        if not forced:
            _journal(syslog.LOG_WARNING, f"refused {what}: {_one_line(decisions)}")
            if not getattr(args, "json", False):
                print(f"rdmad-guard: {text}", file=sys.stderr)
            return EXIT_REFUSED
        _journal(syslog.LOG_WARNING, f"FORCED {what} although in use: {_one_line(decisions)}")
        print(f"rdmad-guard: forced (RDMAD_GUARD_FORCE): {text}", file=sys.stderr)
    elif args.command == "check" and not args.json:
        print("\n".join(d.explain() for d in decisions))
    if args.command in ("hook", "stack-stop"):
        _pause(sysfs, args, decisions)
    return EXIT_ALLOWED


def targets_of(args: argparse.Namespace) -> list[str]:
    if args.command == "hook":
        return [args.module]
    if args.command == "check":
        return [args.target]
    return ["the RDMA stack"]


def _what(args: argparse.Namespace, targets: list[str]) -> str:
    who = describe_caller()
    if args.command == "hook":
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
    from rdmad.kernel.usage import OpenFiles, rdma_links_from_sysfs

    if os.path.realpath(sysfs.root) != "/":  # a tree (tests): no netlink into it
        return list(rdma_links_from_sysfs(sysfs, OpenFiles())), None
    import asyncio  # only here: ~60 ms that a node without RDMA never pays

    from rdmad.kernel.errors import KernelError
    from rdmad.kernel.rdma import RdmaNetlink
    from rdmad.model.observed import Usage, Use

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


def _pause(sysfs: Sysfs, args: argparse.Namespace, decisions: list[Decision]) -> None:
    modules = sorted({m for d in decisions for m in d.modules} | {STACK_CORE})
    if args.command == "hook":
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
        print(f"rdmad-guard: could not pause rdmad ({exc}); it may reload modules", file=sys.stderr)
        return
    _journal(syslog.LOG_INFO, f"allowed; rdmad stands back: {pause.describe()}")


def _failed(args: argparse.Namespace, targets: list[str], why: str, forced: bool) -> int:
    what = _what(args, targets)
    if forced:
        _journal(syslog.LOG_WARNING, f"FORCED {what}; the guard could not decide: {why}")
        print(f"rdmad-guard: forced although the guard could not decide: {why}", file=sys.stderr)
        return EXIT_ALLOWED
    _journal(syslog.LOG_WARNING, f"refused {what}: the guard could not decide: {why}")
    print(
        f"rdmad-guard: refused: the guard could not decide: {why}\n  {FORCE_HINT}", file=sys.stderr
    )
    return EXIT_REFUSED


def _one_line(decisions: list[Decision]) -> str:
    return (
        "; ".join(f"{h.what}: {h.usage.describe()}" for d in decisions for h in d.held)
        or "nothing in use"
    )


def _journal(priority: int, message: str) -> None:
    """One line to the journal (syslog socket); silent where there is none (a container)."""
    try:
        syslog.openlog("rdmad-guard", syslog.LOG_PID, syslog.LOG_DAEMON)
        syslog.syslog(priority, message)
        syslog.closelog()
    except OSError:
        pass
