"""The `rdmad` command: version, check-config, plan, snapshot, run (the daemon).

Exit codes: 0 fine, 1 a runtime failure (kernel unreadable), 2 bad input
(invalid config, bad arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from rdmad import __version__, config, state
from rdmad.kernel.oneshot import observe_host
from rdmad.model import Action, ObjectState, Observed, PlanState, summarize
from rdmad.reconcile import declared_objects, plan

EXIT_OK, EXIT_FAIL, EXIT_INPUT = 0, 1, 2
BOOT_ID = "proc/sys/kernel/random/boot_id"  # under --root


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return EXIT_INPUT
    handler = {
        "check-config": cmd_check_config,
        "plan": cmd_plan,
        "snapshot": cmd_snapshot,
        "run": cmd_run,
    }[args.command]
    return handler(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rdmad", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"rdmad {__version__}")
    sub = p.add_subparsers(dest="command")
    cc = sub.add_parser("check-config", help="validate the config; print every error")
    _config_arg(cc)
    cc.add_argument("--json", action="store_true", help="machine-readable output")
    pl = sub.add_parser("plan", help="observe the node and print what rdmad would do")
    _config_arg(pl)
    pl.add_argument(
        "--root",
        default="/",
        help="observe the sysfs/procfs tree under this directory instead of the host",
    )
    pl.add_argument(
        "--state",
        type=Path,
        default=None,
        help="the daemon's state file, for which rxe links it created "
        "(default: state.json in [daemon] state_dir)",
    )
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
    rn.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None)
    rn.add_argument("--log-format", choices=["auto", "json", "logfmt", "console"], default=None)
    return p


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=Path,
        default=config.DEFAULT_DIR,
        help="config directory (rdmad.toml + rdmad.d/*.toml) or one file "
        f"(default {config.DEFAULT_DIR})",
    )


def _load(args: argparse.Namespace) -> config.LoadedConfig | None:
    try:
        return config.load(args.config)
    except config.ConfigInvalid as exc:
        if getattr(args, "json", False):
            _print_json({"valid": False, "errors": [e.__dict__ for e in exc.errors]})
        else:
            print(f"rdmad: {len(exc.errors)} error(s) in the config:", file=sys.stderr)
            for err in exc.errors:
                print(f"  {err}", file=sys.stderr)
        return None


def cmd_check_config(args: argparse.Namespace) -> int:
    loaded = _load(args)
    if loaded is None:
        return EXIT_INPUT
    d = loaded.desired
    if args.json:
        _print_json({"valid": True, "files": list(loaded.files), "desired": d.model_dump()})
    else:
        files = ", ".join(loaded.files) or "no config files (nothing declared)"
        print(f"config OK: {files}")
        print(f"  {len(d.sriov)} SR-IOV PF(s), {len(d.rxe)} rxe link(s), peermem {d.peermem.mode}")
    return EXIT_OK


def cmd_plan(args: argparse.Namespace) -> int:
    loaded = _load(args)
    if loaded is None:
        return EXIT_INPUT
    try:
        observed = observe_host(Path(args.root))
    except OSError as exc:
        print(f"rdmad: cannot observe {args.root}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    # The daemon's own memory of which rxe links it created, by its own rule (only
    # within the boot that created them), so the plan is what the daemon would do.
    state_file = args.state or Path(
        state.resolve_dir(loaded.desired.daemon.state_dir), state.FILENAME
    )
    owned, state_line = state.describe_ownership(state_file, _boot_id(Path(args.root)))
    actions = plan(loaded.desired, observed, PlanState(managed_rxe=owned))
    statuses = summarize(declared_objects(loaded.desired), actions)
    if args.json:
        _print_json(
            {
                "root": args.root,
                "state": {
                    "file": str(state_file),
                    "managed_rxe": sorted(owned),
                    "line": state_line,
                },
                "objects": [
                    {"object": s.obj, "state": s.state.value, "message": s.message}
                    for s in statuses
                ],
                "actions": [action_json(a) for a in actions],
                "notes": list(observed.notes),
            }
        )
    else:
        _print_plan(args.root, observed, state_line, actions, statuses)
    return EXIT_OK


def _boot_id(root: Path) -> str:
    """This boot's id as the daemon reads it ("" when unknown: then rdmad owns nothing)."""
    try:
        return (root / BOOT_ID).read_text().strip()
    except OSError:
        return ""


def cmd_snapshot(args: argparse.Namespace) -> int:
    from rdmad.snapshot import header_for, settings_unknown, snapshot

    try:
        observed = observe_host(Path(args.root))
    except OSError as exc:
        print(f"rdmad: cannot observe {args.root}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    where = "this host" if args.root == "/" else args.root
    unknown = settings_unknown(observed)
    text = snapshot(observed, header=header_for(observed, where))
    if args.json:
        _print_json({"toml": text, "notes": list(observed.notes), "settings_unknown": unknown})
    elif args.output is None:
        sys.stdout.write(text)
    if args.output is not None:
        try:
            _write_atomic(args.output, text)
        except OSError as exc:
            print(f"rdmad: cannot write {args.output}: {exc}", file=sys.stderr)
            return EXIT_FAIL
    return EXIT_OK


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def cmd_run(args: argparse.Namespace) -> int:
    from rdmad import daemon

    opts = daemon.RunOptions(args.config, args.dry_run, args.log_level, args.log_format)
    return daemon.run(opts)


def action_json(action: Action) -> dict[str, Any]:
    return {
        "object": action.obj,
        "kind": action.kind,
        "changes_kernel": action.changes_kernel,
        "what": action.describe(),
        "reason": action.reason,
    }


def _print_plan(
    root: str, observed: Observed, state_line: str, actions: list[Action], statuses: list[Any]
) -> None:
    where = "this host" if root == "/" else root
    print(
        f"Observed {where}: {len(observed.pfs)} SR-IOV PF(s), "
        f"{len(observed.rdma_links)} RDMA device(s), {len(observed.netdevs)} netdev(s)"
    )
    print(f"  {state_line}")
    for note in observed.notes:
        print(f"  note: {note}")
    print()
    width = max([len(s.obj) for s in statuses] + [6])
    print(f"{'OBJECT':<{width}}  STATE")
    for s in statuses:
        msg = "" if s.state is ObjectState.CONVERGED else f"  ({s.message})"
        print(f"{s.obj:<{width}}  {s.state.value}{msg}")
    print()
    todo = [a for a in actions if a.changes_kernel]
    if not actions:
        print("Nothing to do: the node matches its declaration.")
        return
    print(f"Plan: {len(todo)} change(s), in order")
    n = 0
    for a in actions:
        if a.changes_kernel:
            n += 1
            print(f"{n:>2}. [{a.obj}] {a.describe()}")
            print(f"      because: {a.reason}")
        else:
            print(f"  - [{a.obj}] {a.describe()}")


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


if __name__ == "__main__":
    sys.exit(main())
