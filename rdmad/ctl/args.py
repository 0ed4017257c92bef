"""rdmad-ctl's command line: the parser, its help (meant to replace a man page), and
the ``--since`` time parser.

Options common to every command (``--json``, ``--socket``, ``--timeout``,
``--state-dir``, ``--config``) are accepted before or after the command name: operators type
``rdmad-ctl status --json`` as often as ``rdmad-ctl --json status``.
"""

from __future__ import annotations

import argparse
import os

from rdmad import __version__, exits
from rdmad.ctl.client import DEFAULT_SOCKET
from rdmad.ctl.offline import DEFAULT_STATE_DIR
from rdmad.ctl.paths import DEFAULT_CONFIG

DESCRIPTION = """\
rdmad-ctl asks the running rdmad daemon, over its local API socket, what the
node's RDMA / SR-IOV setup looks like and why, and tells it to reload or
reconcile. It changes nothing by itself.
"""

EPILOG = (
    """\
examples:
  rdmad-ctl status                  # exit 0 when converged
  rdmad-ctl status -v               # every VF and attribute
  rdmad-ctl status --json | jq '.objects[] | select(.state != "converged")'
  rdmad-ctl history sriov pci=0000:3b:00.0 --since 1h
  rdmad-ctl reconcile --wait 30 && echo converged
  rdmad-ctl snapshot -o /etc/rdmad/rdmad.d/50-snapshot.toml
  rdmad-ctl --socket /tmp/rdmad.sock watch

"""
    + exits.help_text()
    + f"""
  When rdmad is not running, `status` (and `history`) say what systemd says of
  rdmad.service (starting, restarting after a crash, stopped, failed; else how
  to start it) and show what the daemon saved: the state file, its age, the
  last changes and errors it holds.

files:
  {DEFAULT_SOCKET}
      the API socket (root:rdmad 0660); rdmad-ctl reads [api] socket from the config
  {DEFAULT_STATE_DIR}/state.json
      the daemon's saved state, read when the daemon is down ([daemon] state_dir)
  /etc/rdmad/rdmad.toml, /etc/rdmad/rdmad.d/*.toml
      the config the daemon reads (`rdmad-ctl config` shows the effective one);
      rdmad-ctl takes the socket and state directory from it (--config DIR|FILE)

environment:
  RDMAD_SOCKET   the API socket (--socket wins over it; it wins over the config)
  NO_COLOR       no colour even on a terminal (colour is only ever on a terminal)

The API is documented in /usr/share/doc/rdmad/API.md, its metrics in METRICS.md
there; anything that speaks HTTP over a UNIX socket can use it:
  curl --unix-socket {DEFAULT_SOCKET} http://rdmad/v1/status
"""
)

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (one-line help, examples)
    "status": (
        "the node at a glance (exit 0 converged, 1 not)",
        "examples:\n  rdmad-ctl status\n  rdmad-ctl status -v\n  rdmad-ctl status --json\n\n"
        "One line per object: state, object, what the kernel shows (e.g. '4/4 VFs',\n"
        "'netdev eth0') and the reason. Then the attributes and VFs that are not\n"
        "converged with their reasons, and for a VF in use who holds it (pid, comm,\n"
        "VM or namespace). States: converged, pending, blocked, degraded (applying\n"
        "failed, retried with backoff), unsupported-by-driver, drift-on-in-use-vf.\n"
        "The headline is the daemon's verdict: converged (every object converged or\n"
        "unsupported-by-driver), NOT converged, or DEGRADED (passes fail: it names the\n"
        "error). Exit 0 when converged, 1 when not, 3 when rdmad is not running (then\n"
        "the last saved state is shown).",
    ),
    "plan": (
        "the daemon's exact next pass, without applying it",
        "examples:\n  rdmad-ctl plan\n  rdmad-ctl plan --json\n\n"
        "The daemon observes the kernel now and plans with its own state (the config\n"
        "in force, the rxe links it created, attributes drivers refused); `rdmad\n"
        "plan --daemon` prints the same (`rdmad plan` previews the config on disk).\n"
        "Exit 0 when the plan leaves no object blocked or degraded (changes to make\n"
        "are fine), 1 when it does.",
    ),
    "history": (
        "changes and events, oldest first",
        "examples:\n  rdmad-ctl history\n  rdmad-ctl history rxe rxe0 --since 2h\n"
        "  rdmad-ctl history sriov pci=0000:3b:00.0 --json\n"
        "  rdmad-ctl history --since '2026-01-31 08:00' --limit 20\n\n"
        "--since takes a duration back from now (30s, 10m, 2h, 1d, 1h30m), a local\n"
        "date/time in ISO form (2026-01-31, 2026-01-31T08:00) or @UNIXTIME.",
    ),
    "watch": (
        "follow changes live, one line per event (Ctrl-C stops, exit 0)",
        "examples:\n  rdmad-ctl watch\n  rdmad-ctl watch --json   # one JSON object per line\n\n"
        "Exits 1 when the daemon closes the stream (it stopped, or this reader fell\n"
        "too far behind).",
    ),
    "wait": (
        "wait until the node is converged (exit 0), or --within seconds (exit 1)",
        "examples:\n  rdmad-ctl wait\n  rdmad-ctl wait --within 300 && srun ...\n"
        "  systemctl start rdmad-wait-converged   # the unit consumers order after\n\n"
        "Returns as soon as rdmad's verdict is converged: every declared object\n"
        "converged or unsupported-by-driver (what `status` exits 0 on), said by a\n"
        "pass that began after this asked, so a change made just before (modprobe,\n"
        "a value set by hand) is in it. No polling: each request asks for a pass and\n"
        "the daemon answers when a pass gets there (--within 0: the last pass's\n"
        "verdict, without asking for one). While it waits on a terminal it says\n"
        "what is still missing every few seconds. When --within (default 120)\n"
        "passes first it prints the status of what is not converged and exits 1;\n"
        "exit 3 when rdmad is not running (order a unit after rdmad.service, or\n"
        "start it first), unless systemd says rdmad.service is starting or will be\n"
        "restarted: then it waits for it. Once rdmad has answered, a restart (a\n"
        "crash and systemd's Restart=, systemctl restart) is waited out while\n"
        "--within lasts; exit 3 if it is still down then, or at once when systemd\n"
        "says rdmad's unit was stopped and nothing starts it again (systemctl stop\n"
        "rdmad, a crash past its start limit). A request rdmad answers late (right\n"
        "after start, its web server still loading) is asked again while --within\n"
        "lasts; exit 5 only if no answer came. Needs root or the API's read group.\n"
        "rdmad-wait-converged.service runs it at boot: units that need RDMA order\n"
        "after it (Wants= or Requires= and After=).",
    ),
    "reload": (
        "re-read the config (as SIGHUP / systemctl reload rdmad)",
        "examples:\n  rdmad-ctl reload\n  rdmad-ctl reload --wait 0\n\n"
        "Waits (--wait, default 30 s) for the pass that answers it and prints its\n"
        "summary; exit 0 when the node is then converged. An invalid config is\n"
        "reported, every error listed, and the last good one kept: exit 6. Needs\n"
        "root or [api] write_group.",
    ),
    "reconcile": (
        "run a reconcile pass now",
        "examples:\n  rdmad-ctl reconcile\n  rdmad-ctl reconcile --wait 60 && echo converged\n\n"
        "Waits (--wait, default 30 s) for the pass and prints its summary; exit 0\n"
        "when the node is then converged. Needs root or [api] write_group.",
    ),
    "snapshot": (
        "the live SR-IOV and rxe state in config format",
        "examples:\n  rdmad-ctl snapshot\n"
        "  rdmad-ctl snapshot -o /etc/rdmad/rdmad.d/50-snapshot.toml\n\n"
        "Makes what was set by hand persistent: review the file, then reload.",
    ),
    "config": (
        "the effective config, each value with the file and key it came from",
        "examples:\n  rdmad-ctl config\n  rdmad-ctl config --json\n\n"
        "Exit 6 when the config on disk is invalid (its errors are listed; the daemon\n"
        "keeps the last good one).",
    ),
    "guard": (
        "may a PF driver (or rdma_rxe) be unloaded now? (exit 0 yes, 1 no)",
        "examples:\n  rdmad-ctl guard check igb\n  rdmad-ctl guard check 0000:3b:00.0 --json\n\n"
        "Decides from the kernel directly, like the modprobe.d hook rdmad installs for\n"
        "PFs with driver_guard = true (`modprobe -r DRIVER` runs this check first and\n"
        "fails when it refuses); works with the daemon down and changes nothing. A\n"
        "module or driver name checks every VF of every PF bound to it; a PCI address\n"
        "checks that PF's VFs (or that VF). In use: a process holds its vfio group or\n"
        "iommufd device, a libvirt domain lists it, its netdev is in another network\n"
        "namespace, an RDMA device or rxe link on it has users. Unknown counts as in\n"
        "use. Each refusal names the holder and what to do. --force (or\n"
        "RDMAD_GUARD_FORCE=1 in the environment of `modprobe -r`) allows it anyway and\n"
        "is logged to the journal with the caller. Not guarded: `rmmod`, a direct\n"
        "sysfs unbind, a kernel crash.",
    ),
    "pause": (
        "stand back: load no module and create no rxe link for a while",
        "examples:\n  rdmad-ctl pause --for 600 --reason 'MOFED upgrade'\n  rdmad-ctl resume\n\n"
        "For a deliberate stop of the RDMA stack by hand: rdmad would otherwise load\n"
        "rdma_rxe (and so hold ib_core) the moment it disappears. The pause ends at\n"
        "--for seconds (at most 3600), when ib_core is loaded again, or at `rdmad-ctl\n"
        "resume`; then rdmad restores everything. `modprobe -r` of a guarded module\n"
        "and `systemctl stop openibd` pause rdmad by themselves. `status` shows the\n"
        "pause and who asked for it.",
    ),
    "resume": (
        "end a pause now (rdmad restores what the pause held back)",
        "examples:\n  rdmad-ctl resume",
    ),
    "doctor": (
        "what blocks RDMA / GPUDirect on this node (read-only; no daemon needed)",
        "examples:\n  rdmad-ctl doctor\n  rdmad-ctl doctor --json | jq '.checks[] | "
        'select(.status == "fail")\'\n'
        "  rdmad-ctl doctor --config /etc/rdmad/rdmad.toml\n\n"
        "Reads /sys, /proc, /lib/modules and /boot/config-RELEASE directly: it loads,\n"
        "unloads and writes nothing, needs neither the daemon nor root, and no\n"
        "modprobe, modinfo, ip or rdma binary. Checks: RDMA devices and the link layer\n"
        "of each port (with none, why: no ConnectX PCI function at all, one no driver\n"
        "took while mlx5_core is built in or loaded (named, to bind), or an mlx5 module\n"
        "to load); drivers (ib_core, ib_uverbs, mlx5_core, mlx5_ib: loaded module,\n"
        "built in or absent; the MOFED/DOCA version, >= 23.10 for GPUDirect); the IOMMU\n"
        "mode (iommu=pt or a translated default domain: IBV_WC_LOC_PROT_ERR; a warning\n"
        "where SR-IOV or RDMA is declared or present, else said only; with no IOMMU\n"
        "group nothing is translated now, and the default domain, from the kernel log,\n"
        "the command line or the kernel's build, says what a device the IOMMU takes\n"
        "later would get); whether modules can be loaded (modules_disabled, signature\n"
        "enforcement); GPUDirect peer memory (nvidia-peermem / nvidia-p2p: installed\n"
        "for this kernel, signed, built against an ib_core with the peer-memory API,\n"
        "errors in the kernel log; DMA-BUF as the alternative); rxe availability;\n"
        "SR-IOV capability of the PFs the config declares. Each finding says what was\n"
        "seen and what to do; what could not be read (not root: /proc/kallsyms, the\n"
        "kernel log) is listed.\n"
        "Exit 1 when something blocks RDMA (a FAIL line), 0 otherwise; 2 when --root is\n"
        "not a directory.",
    ),
}


class _Help(argparse.RawDescriptionHelpFormatter):
    """argparse's layout at the terminal's width, measured as shutil would (COLUMNS,
    then the terminal) without importing shutil: argparse makes a formatter for every
    option it registers, and shutil's imports cost 3 ms of start-up."""

    def __init__(self, prog: str) -> None:
        try:
            columns = int(os.environ.get("COLUMNS", "0")) or os.get_terminal_size().columns
        except (ValueError, OSError):
            columns = 80
        super().__init__(prog, width=max(columns - 2, 40))


WAIT_WITHIN = 120.0  # rdmad-ctl wait's default bound, as systemd-networkd-wait-online's
# An answer's bound: an hour is more than any request takes (one that waits for a pass
# adds its own --wait to it).
TIMEOUT_MAX = 3600.0
# The API's bound on ?wait= of reload and reconcile (rdmad.api.routes, which rdmad-ctl
# does not import: it loads the standard library only; a test keeps the two equal).
MUTATION_WAIT_MAX = 600.0

VALUE_OPTIONS = ("--socket", "--timeout", "--state-dir", "--config")


def parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``argv``, only the sub-command it names is built in
    full (each costs a millisecond or so of start-up), all of them when it names none."""
    p = exits.Parser(
        prog="rdmad-ctl", description=DESCRIPTION, epilog=EPILOG, formatter_class=_Help
    )
    p.add_argument("--version", action="version", version=f"rdmad-ctl {__version__}")
    _common(p, suppress=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    common = exits.Parser(add_help=False, formatter_class=_Help)
    _common(common, suppress=True)
    wanted = _command_in(argv)
    for name, (summary, details) in COMMANDS.items():
        if wanted is None or name == wanted:
            cmd = sub.add_parser(
                name,
                help=summary,
                description=summary[0].upper() + summary[1:] + ".",
                epilog=details,
                parents=[common],
                formatter_class=_Help,
            )
            _arguments(name, cmd)
    return p


def _command_in(argv: list[str] | None) -> str | None:
    """The command ``argv`` names, read as argparse will (an option's value is not a
    command); None when there is none or it is not one of ours."""
    if argv is None:
        return None
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token in VALUE_OPTIONS:
            skip = True
        elif not token.startswith("-"):
            return token if token in COMMANDS else None
    return None


def _arguments(name: str, cmd: argparse.ArgumentParser) -> None:
    """What a command takes beyond the common options."""
    if name == "status":
        cmd.add_argument(
            "-v", "--verbose", action="store_true", help="every VF and attribute, converged or not"
        )
    elif name == "history":
        cmd.add_argument(
            "object",
            nargs="*",
            metavar="OBJECT",
            help="only this object, e.g. sriov pci=0000:3b:00.0 or rxe rxe0 (quotes optional)",
        )
        cmd.add_argument("--since", type=since, metavar="DURATION|TIME", help="only entries after")
        cmd.add_argument(
            "--limit", type=positive_int, metavar="N", help="the newest N (default 200)"
        )
    elif name == "wait":
        cmd.add_argument(
            "--within",
            type=seconds,
            default=WAIT_WITHIN,
            metavar="S",
            help=f"give up after S seconds (default {WAIT_WITHIN:g}; 0: look once)",
        )
    elif name in ("reload", "reconcile"):
        cmd.add_argument(
            "--wait",
            type=mutation_wait,
            default=30.0,
            metavar="S",
            help="wait up to S seconds for the pass that answers it (0: do not wait; "
            f"at most {MUTATION_WAIT_MAX:g}; default 30)",
        )
    elif name == "doctor":
        cmd.add_argument(
            "--root",
            default="/",
            metavar="DIR",
            help="read the host's /sys, /proc, /lib/modules and /boot under DIR (default /)",
        )
    elif name == "snapshot":
        cmd.add_argument(
            "-o", "--output", metavar="FILE", help="write the TOML to FILE (atomically)"
        )
    elif name == "guard":
        cmd.add_argument("action", choices=["check"], help="check: decide, change nothing")
        cmd.add_argument(
            "target", help="module or driver (igb, mlx5_core, rdma_rxe) or PCI address"
        )
        cmd.add_argument("--force", action="store_true", help="allow even when in use (logged)")
    elif name == "pause":
        cmd.add_argument(
            "--for",
            dest="seconds",
            type=seconds,
            default=600.0,
            metavar="S",
            help="at most S seconds (1..3600, default 600)",
        )
        cmd.add_argument("--reason", default="rdmad-ctl pause", help="shown in status")


def _common(p: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes; on the sub-parsers without defaults, so one
    given before the command is not overwritten by the sub-parser's default."""

    def d(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    p.add_argument("--json", action="store_true", default=d(False), help="the API's JSON")
    p.add_argument(
        "--socket",
        default=d(None),
        metavar="PATH",
        help=f"the API socket (default $RDMAD_SOCKET, else [api] socket of the config, "
        f"else {DEFAULT_SOCKET})",
    )
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        default=d(5.0),
        metavar="S",
        help="seconds to wait for an answer, room in a busy socket's queue included (default 5)",
    )
    p.add_argument(
        "--state-dir",
        default=d(None),
        metavar="DIR",
        help=f"where the daemon saves its state, read when it is down (default [daemon] "
        f"state_dir of the config, else {DEFAULT_STATE_DIR})",
    )
    p.add_argument(
        "--config",
        default=d(DEFAULT_CONFIG),
        metavar="DIR|FILE",
        help="rdmad's config: the socket and state directory when not given, and for "
        f"doctor [peermem] mode and the declared PFs (default {DEFAULT_CONFIG})",
    )


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0: {text!r}")
    return value


def timeout_seconds(text: str) -> float:
    """``--timeout``: more than 0 (0 makes the socket non-blocking: every read fails at
    once, as if rdmad had closed the connection) and at most TIMEOUT_MAX (a socket's
    timeout has a bound of its own, ~9e9 s, past which Python raises rather than waits).
    """
    value = seconds(text)
    if not 0 < value <= TIMEOUT_MAX:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {TIMEOUT_MAX:g}: {text!r}"
        )
    return value


def mutation_wait(text: str) -> float:
    """``--wait`` of reload and reconcile: at most the API's own bound (MUTATION_WAIT_MAX),
    said here rather than by the daemon after the request."""
    value = seconds(text)
    if value > MUTATION_WAIT_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {MUTATION_WAIT_MAX:g}: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class Since:
    """A ``--since`` value: a time, or a duration back from when the command runs."""

    def __init__(self, at: float | None = None, back: float | None = None) -> None:
        self._at, self._back = at, back

    def at(self, now: float) -> float:
        return self._at if self._at is not None else now - (self._back or 0.0)


def since(text: str) -> Since:
    """A duration back from now (``1h30m``), a local ISO date/time, or ``@UNIXTIME``.
    A bare number is refused: seconds or a time, it cannot say which."""
    text = text.strip()
    if text.startswith("@"):
        try:
            return Since(at=float(text[1:]))
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a Unix time: {text!r}") from None
    back = _duration(text)
    if back is not None:
        return Since(back=back)
    if text.replace(".", "", 1).isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a unit (e.g. {text}s, {text}m) or a Unix time as @{text}"
        )
    from datetime import datetime  # only for this form; it costs start-up time

    try:
        return Since(at=datetime.fromisoformat(text).timestamp())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration (30s, 10m, 2h, 1d, 1h30m), an ISO time (2026-01-31T08:00) "
            f"or @UNIXTIME: {text!r}"
        ) from None


def _duration(text: str) -> float | None:
    total, number = 0.0, ""
    if not text or text[-1] not in _UNITS:
        return None
    for ch in text:
        if ch.isdigit() or ch == ".":
            number += ch
        elif ch in _UNITS and number:
            try:
                total += float(number) * _UNITS[ch]
            except ValueError:
                return None
            number = ""
        else:
            return None
    return total
