"""The `rdmad` command: version, check-config, plan, snapshot, run (the daemon).

Exit codes are rdmad-ctl's too (rdmad/exits.py): 0 fine, 1 not as declared (a plan
that leaves an object blocked) or a failure (kernel unreadable), 2 bad arguments, 3/4/5
the daemon not running, refusing or not answering (`plan --daemon`), 6 an invalid
config. With --json every failure prints the JSON error object on stdout.

`rdmad plan` previews the config on disk: it observes and plans here, the answer to
"what will this edit do?" (`systemctl reload rdmad` applies it). `rdmad plan
--daemon` (and `rdmad-ctl plan`) prints the running daemon's pending plan instead,
made from the config it loaded (docs/API.md `/v1/plan`). Each says which it is.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

# Only what `check-config` needs is imported here: it is systemd's ExecReload (run on
# every `systemctl reload rdmad`) and the Ansible role's validate step, and the
# planner, the kernel layer and the status store (structlog, asyncio with them) are
# most of this module's import time. plan, snapshot and run import them when run.
from rdmad import __version__, config, exits
from rdmad.text import safe

if TYPE_CHECKING:
    from rdmad.model import Action, ObjectStatus, Observed

BOOT_ID = "proc/sys/kernel/random/boot_id"  # under --root


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command is None:
        parser().print_help()
        return exits.USAGE
    handler = {
        "check-config": cmd_check_config,
        "plan": cmd_plan,
        "snapshot": cmd_snapshot,
        "run": cmd_run,
    }[args.command]
    return handler(args)


def parser() -> argparse.ArgumentParser:
    p = exits.Parser(
        prog="rdmad",
        description=__doc__.splitlines()[0],
        epilog=exits.help_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"rdmad {__version__}")
    sub = p.add_subparsers(dest="command")
    cc = sub.add_parser("check-config", help="validate the config; print every error")
    _config_arg(cc)
    cc.add_argument("--json", action="store_true", help="machine-readable output")
    pl = sub.add_parser(
        "plan",
        help="print what the config on disk would do here (--daemon: the running "
        "daemon's pending plan, from the config it loaded)",
    )
    _config_arg(pl)
    pl.add_argument(
        "--root",
        default=None,
        help="observe the sysfs/procfs tree under this directory instead of the host "
        "(computed here, not asked of the daemon)",
    )
    pl.add_argument(
        "--state",
        type=Path,
        default=None,
        help="the daemon's state file, for which rxe links it created "
        "(default: state.json in [daemon] state_dir)",
    )
    pl.add_argument(
        "--daemon",
        action="store_true",
        help="print the running daemon's pending plan, from the config it loaded (its "
        "socket: $RDMAD_SOCKET or [api] socket); as `rdmad-ctl plan`",
    )
    # The default since the plan previews the config on disk; kept for scripts.
    pl.add_argument("--local", action="store_true", help=argparse.SUPPRESS)
    pl.add_argument("--json", action="store_true", help="machine-readable output")
    sn = sub.add_parser(
        "snapshot",
        help="write the node's live SR-IOV and rxe state in config format "
        "(make what was set by hand persistent)",
    )
    sn.add_argument(
        "--root",
        default="/",
        help="observe the sysfs/procfs tree under this directory instead of the host",
    )
    sn.add_argument(
        "-o", "--output", type=Path, default=None, help="write to this file (atomically)"
    )
    sn.add_argument(
        "--json", action="store_true", help="print {'toml': ..., 'notes': [...]} instead"
    )
    rn = sub.add_parser("run", help="run the daemon (in the foreground, as systemd expects)")
    _config_arg(rn)
    rn.add_argument("--foreground", action="store_true", help="accepted; always the case")
    rn.add_argument("--dry-run", action="store_true", help="log the actions, change nothing")
    rn.add_argument(
        "--root",
        default=None,
        help="with --dry-run: observe the sysfs/procfs tree under this directory instead "
        "of the host (a what-if run against a copied or made-up node)",
    )
    rn.add_argument(
        "--guard-kit",
        type=Path,
        default=None,
        metavar="DIR",
        help="rdmad runs in a container and the host has not its package: copy the driver "
        "guard to DIR, a host directory mounted at the same path, for the host's modprobe.d "
        "hook to run with the host's python3; the hook is removed when rdmad stops",
    )
    rn.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=None,
        help="the least level logged (default: [daemon] log_level of the config, info)",
    )
    rn.add_argument(
        "--log-format",
        choices=["auto", "json", "logfmt", "console"],
        default=None,
        help="default: [daemon] log_format of the config; auto is console on a terminal, "
        "logfmt otherwise (the journal)",
    )
    return p


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="config directory (rdmad.toml + rdmad.d/*.toml) or one file "
        f"(default {config.DEFAULT_DIR})",
    )


def _config_path(args: argparse.Namespace) -> Path:
    return config.DEFAULT_DIR if args.config is None else Path(args.config)


def _fail(args: argparse.Namespace, code: int, message: str, **more: object) -> int:
    """A failure: its words on stderr, with --json also the JSON error object on stdout
    (``more`` goes into it, e.g. a config's ``errors``); the exit code ``code``."""
    print(f"rdmad: {safe(message)}", file=sys.stderr)
    if getattr(args, "json", False):
        _print_json(exits.error_doc(code, message, **more))
    return code


def _root_missing(args: argparse.Namespace) -> int | None:
    """--root that is not a directory: a usage error (observing it would find an empty
    node, "0 PFs", and plan to create everything), as `rdmad-ctl doctor` says."""
    if args.root is None or os.path.isdir(args.root):
        return None
    return _fail(args, exits.USAGE, f"--root {args.root}: not a directory")


def _load(args: argparse.Namespace) -> config.LoadedConfig | config.ConfigInvalid:
    """The config, or what is wrong with it (printed on stderr, every error)."""
    try:
        return config.load(_config_path(args))
    except config.ConfigInvalid as exc:
        print(f"rdmad: {len(exc.errors)} error(s) in the config:", file=sys.stderr)
        for err in exc.errors:
            print(f"  {safe(str(err))}", file=sys.stderr)
        return exc


def _invalid(exc: config.ConfigInvalid) -> dict[str, object]:
    """The JSON error object of an invalid config: each error with file, line, key."""
    return exits.error(
        exits.CONFIG_INVALID,
        f"{len(exc.errors)} error(s) in the config",
        errors=[msgspec.structs.asdict(e) for e in exc.errors],
    )


def cmd_check_config(args: argparse.Namespace) -> int:
    loaded = _load(args)
    if isinstance(loaded, config.ConfigInvalid):
        if args.json:
            _print_json({"valid": False, "error": _invalid(loaded)})
        return exits.CONFIG_INVALID
    d = loaded.desired
    if args.json:
        from msgspec import to_builtins

        _print_json({"valid": True, "files": list(loaded.files), "desired": to_builtins(d)})
    else:
        files = ", ".join(loaded.files) or "no config files (nothing declared)"
        print(f"config OK: {files}")
        named = sum(s.pf is not None for s in d.sriov)
        chosen = len(d.sriov) - named  # by a selector: how many PFs depends on the node
        sriov = f"{named} SR-IOV PF(s), " + (f"{chosen} PF selector(s), " if chosen else "")
        print(f"  {sriov}{len(d.rxe)} rxe link(s), peermem {d.peermem.mode}")
    return exits.OK


def cmd_plan(args: argparse.Namespace) -> int:
    if args.daemon:
        if args.local or any(a is not None for a in (args.root, args.config, args.state)):
            return _fail(
                args,
                exits.USAGE,
                "--daemon prints the daemon's own plan: it takes no --root, --config, "
                "--state or --local",
            )
        return _print_daemon_plan(args)
    from rdmad import state
    from rdmad.kernel.apply.oneshot import observe_host
    from rdmad.model import PlanState, summarize
    from rdmad.reconcile import declared_objects, plan
    from rdmad.status import PlanReport

    missing = _root_missing(args)
    if missing is not None:
        return missing
    args.root = args.root or "/"
    loaded = _load(args)
    if isinstance(loaded, config.ConfigInvalid):
        if args.json:
            _print_json({"error": _invalid(loaded)})
        return exits.CONFIG_INVALID
    try:
        observed = observe_host(Path(args.root))
    except OSError as exc:
        return _fail(args, exits.FAIL, f"cannot observe {args.root}: {exc}")
    # The daemon's own memory of which rxe links it created, by its own rule (only
    # within the boot that created them), so the plan is what the daemon would do.
    state_file = args.state or Path(
        state.resolve_dir(loaded.desired.daemon.state_dir), state.FILENAME
    )
    owned, state_line = state.describe_ownership(state_file, _boot_id(Path(args.root)))
    actions = plan(loaded.desired, observed, PlanState(managed_rxe=owned))
    statuses = summarize(declared_objects(loaded.desired, observed), actions)
    if args.json:
        report = PlanReport(time.time(), "rdmad plan", tuple(actions), tuple(statuses))
        _print_json(
            {
                **report.to_json("local"),
                "config": {"files": list(loaded.files)},
                "root": args.root,
                "state": {
                    "file": str(state_file),
                    "managed_rxe": sorted(owned),
                    "line": state_line,
                },
                "notes": list(observed.notes),
            }
        )
    else:
        _print_plan(args.root, observed, state_line, actions, statuses, loaded.files)
    return plan_exit(statuses)


def plan_exit(statuses: list[ObjectStatus]) -> int:
    """0 when the plan reaches the declared state (changes to make are fine), 1 when it
    leaves an object blocked or degraded (the same rule as `rdmad-ctl plan`)."""
    from rdmad.model import ObjectState

    stuck = (ObjectState.BLOCKED, ObjectState.DEGRADED)
    return exits.FAIL if any(s.state in stuck for s in statuses) else exits.OK


def _print_daemon_plan(args: argparse.Namespace) -> int:
    """Print the running daemon's plan (its /v1/plan document as is with --json), or
    say why there is none: not running (3), refused (4), no answer (5), failed (1)."""
    from rdmad.ctl.client import DEFAULT_SOCKET, Client, CtlError, NotRunning
    from rdmad.ctl.commands import plan_exit as ctl_plan_exit
    from rdmad.ctl.render.formats import clock
    from rdmad.ctl.render.plan import plan_body

    sock = os.environ.get("RDMAD_SOCKET")
    if not sock:
        try:
            sock = config.load(config.DEFAULT_DIR).desired.api.socket
        except config.ConfigInvalid:
            sock = DEFAULT_SOCKET  # the daemon keeps its last good config, and its socket
    try:
        # The daemon takes up to 10 s to answer with a plan (docs/API.md).
        doc = Client(sock, timeout=15.0).get("/v1/plan")
        actions = doc["actions"]
        rows = [(o["obj"], o["state"], o["reason"]) for o in doc["objects"]]
        if not isinstance(actions, list):
            raise TypeError(f"actions is {type(actions).__name__}, not a list")
    except NotRunning as exc:
        return _fail(args, exc.exit_code, f"{exc}; `rdmad plan` previews the config here")
    except CtlError as exc:
        return _fail(args, exc.exit_code, f"no plan from the daemon: {exc}")
    except (KeyError, TypeError) as exc:
        return _fail(args, exits.FAIL, f"the daemon's plan is malformed ({exc!r})")
    code = ctl_plan_exit(doc["objects"])
    if args.json:
        _print_json(doc)  # one plan document: the API's, as `rdmad-ctl plan --json`
        return code
    print(
        f"The running rdmad's plan, from the config it loaded ({sock}, made {clock(doc.get('at'))})"
    )
    print("  `rdmad plan` previews the config on disk instead")
    if doc.get("dry_run"):
        print("  the daemon runs --dry-run: it records these changes, it does not make them")
    print()
    for line in plan_body(rows, actions):
        print(line)
    return code


def _boot_id(root: Path) -> str:
    """This boot's id as the daemon reads it ("" when unknown: then rdmad owns nothing)."""
    try:
        return (root / BOOT_ID).read_text().strip()
    except OSError:
        return ""


def cmd_snapshot(args: argparse.Namespace) -> int:
    from rdmad.fileio import write_atomic
    from rdmad.kernel.apply.oneshot import observe_host
    from rdmad.snapshot import snapshot_doc
    from rdmad.status import API_VERSION

    missing = _root_missing(args)
    if missing is not None:
        return missing
    try:
        observed = observe_host(Path(args.root))
    except OSError as exc:
        return _fail(args, exits.FAIL, f"cannot observe {args.root}: {exc}")
    doc = snapshot_doc(observed, "this host" if args.root == "/" else args.root)
    text = doc["toml"]
    if args.output is not None:
        try:
            write_atomic(args.output, text.encode())
        except OSError as exc:
            return _fail(args, exits.FAIL, f"cannot write {args.output}: {exc}")
    if args.json:
        _print_json({"api": API_VERSION, **doc})  # GET /v1/snapshot's document
    elif args.output is None:
        sys.stdout.write(text)
    return exits.OK


def cmd_run(args: argparse.Namespace) -> int:
    from rdmad import nossl

    nossl.defer()  # before asyncio's first import: no libssl before the first pass
    from rdmad import daemon

    if args.root is not None and not args.dry_run:
        return _fail(
            args, exits.USAGE, "run --root observes a tree it must not change: add --dry-run"
        )
    missing = _root_missing(args)
    if missing is not None:
        return missing
    opts = daemon.RunOptions(
        _config_path(args),
        args.dry_run,
        args.log_level,
        args.log_format,
        args.root or "/",
        args.guard_kit,
    )
    return daemon.run(opts)


def _print_plan(
    root: str,
    observed: Observed,
    state_line: str,
    actions: list[Action],
    statuses: list[Any],
    files: tuple[str, ...],
) -> None:
    where = "this host" if root == "/" else root
    print(
        f"Observed {where}: {len(observed.pfs)} SR-IOV PF(s), "
        f"{len(observed.rdma_links)} RDMA device(s), {len(observed.netdevs)} netdev(s)"
    )
    shown = ", ".join(safe(f) for f in files) or "no file: nothing declared"
    print(f"  planned from the config on disk: {shown}")
    if root == "/":
        print("  (the running daemon acts on the config it loaded: `rdmad plan --daemon`)")
    print(f"  {state_line}")
    for note in observed.notes:
        print(f"  note: {safe(note)}")
    print()
    # The same layout as the daemon's plan (rdmad-ctl plan), from one place.
    from rdmad.ctl.render.plan import plan_body

    rows = [(s.obj, s.state.value, s.message) for s in statuses]
    described = [
        {
            "obj": a.obj,
            "describe": a.describe(),
            "reason": a.reason,
            "changes_kernel": a.changes_kernel,
        }
        for a in actions
    ]
    for line in plan_body(rows, described):
        print(line)


def _print_json(data: Any) -> None:
    exits.print_json(data)


if __name__ == "__main__":
    sys.exit(main())
