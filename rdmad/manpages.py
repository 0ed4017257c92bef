"""The man pages rdmad(8), rdmad-ctl(8) and rdmad.toml(5), made at package build time.

    python -m rdmad.manpages OUTDIR [--version V]   # writes OUTDIR/man8/*.8, man5/*.5

The two commands' pages come from their argument parsers (``rdmad.cli.parser``,
``rdmad.ctl.args.parser``) through argparse-manpage, run as its command line (its
documented interface) with the sections a parser does not hold (FILES, EXIT
STATUS from rdmad/exits.py's table, SEE ALSO) added: a page cannot say less than
``--help`` because it is made from the same parser, at the same build. rdmad.toml(5)
is written here from the walk of the config schema that docs/CONFIG-REFERENCE.md is
made from (``rdmad.configref.tables``): no library turns a msgspec schema into troff.

A tool for the package build (packaging/build-venv.sh) and its tests: nothing in the
daemon imports it, and argparse-manpage is a build and test tool only, never in the
installed environment.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rdmad import __version__, exits
from rdmad.configguide import EXAMPLES, NOT_DONE
from rdmad.configref import Table, tables


@dataclass(frozen=True)
class CommandPage:
    prog: str
    module: str
    function: str  # builds the command's argparse.ArgumentParser
    summary: str  # the NAME line after "prog - "
    sections: str  # argparse-manpage's include format: [SECTION] (or [=SECTION]) + troff
    details: str = ""  # the module's {sub-command: (summary, details)}, if it has one


# What a parser does not hold. A line starting with "[" or "/" is a header there,
# so paths at the start of a line are written "\&/...".
RDMAD_SECTIONS = r"""
[=DESCRIPTION]
rdmad keeps a node's Soft\-RoCE (rxe) links, SR\-IOV VF counts and VF settings
true to the state declared in its config: it observes the kernel, plans the
exact changes, restores them after reboots and driver reloads, and never
touches what is in use or not declared. It runs as the systemd service
\fBrdmad.service\fR (\fBrdmad run \-\-foreground\fR); the other commands
validate, plan and snapshot without a daemon.
[FILES]
.TP
\&/etc/rdmad/rdmad.toml, /etc/rdmad/rdmad.d/*.toml
the declared state, see \fBrdmad.toml\fR(5)
.TP
\&/var/lib/rdmad
the saved state (what rdmad created, its history), [daemon] state_dir
.TP
\&/run/rdmad/rdmad.sock
the local API, [api] socket
.TP
\&/etc/modprobe.d/rdmad\-guard.conf
the driver guard's hook, written and removed by the daemon
.TP
\&/run/systemd/system/openibd.service.d/rdmad\-guard.conf
while a guard is declared and MOFED/DOCA's openibd.service exists: its stop asks the
guard first, then runs the unit's own ExecStop= lines (docs/GUARD.md)
[LOGGING]
One event per line to the journal (\fBjournalctl \-u rdmad\fR), logfmt or JSON
([daemon] log_format); every event, its level and its fields:
\&/usr/share/doc/rdmad/LOGS.md.
[UPGRADE AND ROLLBACK]
An upgrade keeps the config and restarts rdmad, which tears nothing down: it
observes the kernel again and plans nothing for what already matches. The state
file carries a format version: a file of another version (a release with another
format wrote it: a rollback) is moved aside to state.json.corrupt and rebuilt;
history and the record of the rxe links rdmad made in this boot are lost, nothing
in the kernel changes.
An older rdmad refuses config keys it does not know: the whole config is invalid,
and nothing managed, until they are taken out. The details:
\&/usr/share/doc/rdmad/README.md.
[SEE ALSO]
\fBrdmad\-ctl\fR(8), \fBrdmad.toml\fR(5), \fBsystemctl\fR(1), \fBrdma\fR(8),
\fBip\-link\fR(8); /usr/share/doc/rdmad/README.md (start there), with CONFIG.md,
CONFIG\-REFERENCE.md, PLANNER.md, GUARD.md, API.md, METRICS.md, LOGS.md and
FLEET.md beside it
"""

CTL_SECTIONS = r"""
[SEE ALSO]
\fBrdmad\fR(8), \fBrdmad.toml\fR(5); /usr/share/doc/rdmad/API.md (the API this
command speaks), /usr/share/doc/rdmad/METRICS.md
"""

COMMAND_PAGES = (
    CommandPage(
        "rdmad",
        "rdmad.cli",
        "parser",
        "keep a node's RDMA (rxe) and SR-IOV setup true to a declared state",
        RDMAD_SECTIONS,
    ),
    CommandPage(
        "rdmad-ctl",
        "rdmad.ctl.args",
        "parser",
        "ask the rdmad daemon how the node's RDMA and SR-IOV setup is, and why",
        CTL_SECTIONS,
        details="COMMANDS",
    ),
)


def _tool() -> str:
    """argparse-manpage's command, from the environment this python runs in."""
    beside = Path(sys.executable).parent / "argparse-manpage"
    found = str(beside) if beside.exists() else shutil.which("argparse-manpage")
    if not found:
        raise SystemExit(
            "manpages: argparse-manpage is not installed (a build and test tool: "
            "packaging/docs-requirements.lock, or pip install -e '.[dev]')"
        )
    return found


def _epoch() -> str:
    """The build's time: SOURCE_DATE_EPOCH when set, so a rebuild gives the same page."""
    return os.environ.get("SOURCE_DATE_EPOCH", str(int(time.time())))


def _date() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(int(_epoch())))


def _nofill(text: str) -> str:
    """Text laid out by hand (examples, exit codes) kept line for line, as --help shows
    it. Each line starts with a zero-width ``\\&``: no line of it can read as a troff
    request or as a section header of the include file."""
    lines = (f"\\&{ln}" for ln in troff(text.strip("\n")).splitlines())
    return "\n".join([".nf", *lines, ".fi"])


def _include(page: CommandPage) -> str:
    """The page's own sections, then what the parser holds but argparse-manpage would
    reflow or leave out: the command's epilog and each sub-command's details."""
    module = importlib.import_module(page.module)
    parser: argparse.ArgumentParser = getattr(module, page.function)()
    parts = [page.sections.strip("\n"), exit_status()]
    # The exit codes have their own section here (EXIT STATUS), not the epilog's copy.
    # Always given: argparse-manpage would print the parser's epilog there, table and all.
    here = "exit codes (rdmad and rdmad-ctl): see EXIT STATUS\n"
    epilog = (parser.epilog or "").replace(exits.help_text(), here).strip("\n")
    parts += ["[=COMMENTS]", _nofill(epilog)]
    commands: dict[str, tuple[str, str]] = getattr(module, page.details) if page.details else {}
    if any(details for _, details in commands.values()):
        parts.append("[COMMAND DETAILS]")
        for name, (_, details) in commands.items():
            if details:
                parts += [f".SS {troff(page.prog)} {troff(name)}", _nofill(details)]
    return "\n".join(parts) + "\n"


def exit_status() -> str:
    """EXIT STATUS of both command pages: the one table (rdmad/exits.py)."""
    lines = ["[EXIT STATUS]", "rdmad and rdmad\\-ctl share these codes."]
    for code, name, meaning in exits.TABLE:
        lines += [".TP", f"{code} ({troff(name)})", troff(meaning)]
    return "\n".join(lines)


def command_page(page: CommandPage, version: str) -> str:
    """One command's page in troff, from its parser (which must import cleanly here)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{page.prog}.8"
        include = Path(tmp) / f"{page.prog}.8.include"
        include.write_text(_include(page))
        cmd = [
            _tool(),
            *("--module", page.module, "--function", page.function),
            *("--prog", page.prog, "--project-name", "rdmad", "--version", version),
            *("--description", page.summary),
            *("--manual-section", "8", "--manual-title", "System Administration"),
            *("--include", str(include), "--output", str(out)),
        ]
        # COLUMNS: the parsers wrap their help to the terminal; a page is the same
        # whatever terminal built it.
        # PYTHONPATH: the parsers of this rdmad, the one _include read, whatever else
        # the environment has installed.
        env = {
            **os.environ,
            "COLUMNS": "80",
            "SOURCE_DATE_EPOCH": _epoch(),
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
        }
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"manpages: {page.prog}: {proc.stderr.strip()}")
        return out.read_text()


# --- rdmad.toml(5) -------------------------------------------------------------------


def troff(text: str) -> str:
    """Markdown-ish text of the schema's descriptions as troff: `code` in bold, links as
    their text, backslashes and hyphens escaped, no line starting with a control dot."""
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = re.sub(r"\*\*([^*]+)\*\*", r"\\fB\1\\fR", text)
    text = re.sub(r"`([^`]+)`", r"\\fB\1\\fR", text)
    return "\n".join("\\&" + ln if ln[:1] in (".", "'") else ln for ln in text.splitlines())


CONFIG_DESCRIPTION = """\
rdmad reads its declared state from /etc/rdmad/rdmad.toml and then from every
/etc/rdmad/rdmad.d/*.toml in name order; a later file's value overrides an earlier
one's key by key, and an entry of [[rxe]] or [[sriov]] is matched by its name or its
PF. Within one file, a second [[rxe]] of a name or a second [[sriov.vf]] of an index
under one PF is an error, and so is one MAC declared for two VFs of a PF. Any key not
listed here is an error. `rdmad check-config` validates the files and prints every
error; `rdmad-ctl config` shows the effective value of each key and the file it came
from.

What is not declared is never touched: a config that declares nothing (as installed)
changes nothing, loads no module, guards no driver and reports nothing blocked or
degraded, on a GPU node too. A GPU node that wants nvidia-peermem loaded declares
`mode = "auto"` under [peermem].

A **duration** is a number of seconds or a string with a unit: `"150ms"`, `"30s"`,
`"5m"`, `"1h"`. **required**: every entry of the table gives the key; **unset**: no
default, and a key left out has no value (a VF attribute left out is never touched).
Strings are stripped of surrounding spaces; MAC addresses, GUIDs and PCI addresses
are read in any case.
"""


def _table(t: Table) -> list[str]:
    name = f"[[{t.path}]]" if t.array else f"[{t.path}]"
    lines = [f".SS {troff(name)}", troff(t.meaning)]
    for k in t.keys:
        lines += [".TP", f"\\fB{troff(k.key)}\\fR", f"{troff(k.type)}; default: {troff(k.default)}"]
        lines += [".br", troff(k.meaning)]
    return lines


def _guide() -> list[str]:
    """EXAMPLES and WHAT RDMAD DOES NOT DO, from rdmad/configguide.py (as
    docs/CONFIG-REFERENCE.md shows them): each example's file kept line for line."""
    lines = [
        ".SH EXAMPLES",
        "Whole config files of real setups (each passes \\fBrdmad check\\-config\\fR); "
        "one can be a drop\\-in of its own in /etc/rdmad/rdmad.d/.",
    ]
    for ex in EXAMPLES:
        lines += [f".SS {troff(ex.title)}", troff(ex.text), ".PP", ".RS 4"]
        lines += [_nofill(ex.toml), ".RE"]
    lines.append(".SH WHAT RDMAD DOES NOT DO")
    for subject, what in NOT_DONE:
        lines += [".TP", f"\\fB{troff(subject)}\\fR", troff(what)]
    return lines


def config_page(version: str) -> str:
    """rdmad.toml(5): every table and key of the schema, with type, default, meaning."""
    lines = [
        f'.TH RDMAD.TOML "5" "{_date()}" "rdmad {version}" "File Formats"',
        ".SH NAME",
        "rdmad.toml \\- rdmad's declared RDMA (rxe) and SR\\-IOV state",
        ".SH SYNOPSIS",
        "/etc/rdmad/rdmad.toml",
        ".br",
        "/etc/rdmad/rdmad.d/*.toml",
        ".SH DESCRIPTION",
    ]
    for para in CONFIG_DESCRIPTION.split("\n\n"):
        lines += [troff(para.strip()), ".PP"]
    lines.append(".SH TABLES AND KEYS")
    for t in tables():
        lines += _table(t)
    lines += _guide()
    lines += [
        ".SH FILES",
        ".TP",
        "/usr/share/doc/rdmad/examples/rdmad.toml",
        "every key with a comment",
        ".SH SEE ALSO",
        "\\fBrdmad\\fR(8), \\fBrdmad\\-ctl\\fR(8); /usr/share/doc/rdmad/CONFIG.md, "
        "/usr/share/doc/rdmad/CONFIG\\-REFERENCE.md",
    ]
    return "\n".join(lines) + "\n"


# --- the build step -----------------------------------------------------------------


def pages(version: str) -> dict[str, str]:
    """Relative path under a man directory -> the page's troff."""
    out = {f"man8/{p.prog}.8": command_page(p, version) for p in COMMAND_PAGES}
    out["man5/rdmad.toml.5"] = config_page(version)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rdmad.manpages", description=__doc__.split("\n")[0]
    )
    ap.add_argument("outdir", help="the man directory to write into (e.g. .../usr/share/man)")
    ap.add_argument("--version", default=__version__, help="the version the pages name")
    args = ap.parse_args(argv)
    for rel, text in pages(args.version).items():
        path = Path(args.outdir) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
