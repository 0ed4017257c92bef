"""Text others choose never drives the operator's terminal or forges journal lines.

Any user can name a process ``\\x1b]0;...\\x07`` (prctl(PR_SET_NAME), /proc/self/comm):
that comm reaches rdmad-ctl's tables as a VF's holder, the guard's refusal and the
logs. Netdev names, config values in errors and the kernel's words travel the same
way. Every printer escapes them (rdmad.text); JSON keeps the exact string.
rdmad-ctl's tables and lines: tests/ctl/test_escaping.py.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from rdmad import logs
from rdmad.doctor.report import Check, Report
from rdmad.guard import cli
from rdmad.model import ObjectState, Observed, PfObserved, RdmaLinkObserved, VfObserved
from rdmad.snapshot import snapshot
from rdmad.status import ObjectReport, StatusSnapshot
from rdmad.text import safe, safe_lines
from rdmad.tomlcompat import tomllib
from tests.support.fakesysfs import FakeSysfs, mlx5_node

S = ObjectState
# A window title set by a process name, a C1 CSI that clears the screen, a bidi override.
COMM = "\x1b]0;pwned\x07"
NETDEV = "eth\x9b2J0"
CONFIG_VALUE = "02:00:00:00:00:0\x1b[8m"
NEWLINE = "x\nSTOPPING=1"
# What may reach a terminal: printable text and newlines (and, in colour, rdmad's SGR).
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
OUR_SGR = re.compile(r"\x1b\[[0-9;]*m")


def raw_controls(text: str) -> list[str]:
    return CONTROL.findall(text)


# --- the function ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("qemu-system-x86", "qemu-system-x86"),
        ("ünï-çødé 漢字 🙂", "ünï-çødé 漢字 🙂"),  # printable UTF-8 is kept
        (COMM, "\\x1b]0;pwned\\x07"),
        ("a\x9bb\x7fc\x00", "a\\x9bb\\x7fc\\x00"),  # C1, DEL, NUL
        ("a\tb\nc\rd", "a\\tb\\nc\\rd"),
        ("abc\u202edef", "abc\\u202edef"),  # RIGHT-TO-LEFT OVERRIDE
        ("\U000f0000", "\\U000f0000"),  # private use
    ],
)
def test_safe_escapes_what_is_not_printable(raw: str, shown: str) -> None:
    assert safe(raw) == shown
    assert safe(safe(raw)) == safe(raw)  # idempotent: printers may meet a text twice


def test_safe_lines_keeps_only_the_line_breaks() -> None:
    assert safe_lines(f"refused:\n  {COMM}\r") == "refused:\n  \\x1b]0;pwned\\x07\\r"


# --- the daemon's own lines -----------------------------------------------------------------


def test_status_text_is_one_line_without_controls() -> None:
    report = ObjectReport("rxe rxe0", S.BLOCKED, f"in use: pid 9 ({NEWLINE}{COMM})")
    line = StatusSnapshot(objects=(report,), passes=1).summary()
    assert "\n" not in line and raw_controls(line) == []
    assert "pid 9 (x\\nSTOPPING=1\\x1b]0;pwned\\x07)" in line


@pytest.fixture
def own_logging() -> Iterator[None]:
    """logs.configure() changes the process's logging: put it back afterwards."""
    root, kernel = logging.getLogger(), logging.getLogger("rdmad.kernel")
    saved = (root.handlers[:], root.level, kernel.level, structlog.get_config())
    yield
    root.handlers[:], level, kernel_level, config = saved
    root.setLevel(level)
    kernel.setLevel(kernel_level)
    structlog.configure(**config)


@pytest.mark.usefixtures("own_logging")
@pytest.mark.parametrize("fmt", ["console", "logfmt"])
def test_log_lines_carry_no_raw_control_byte(fmt: str) -> None:
    stream = io.StringIO()
    logs.configure("info", fmt, stream=stream, journald=False)
    structlog.get_logger("rdmad.agent").warning(
        "object.drift-on-in-use-vf", obj=f"sriov name={NETDEV}", reason=f"held by {COMM}",
        holders=(COMM,), error=OSError(16, f"busy {COMM}"),
    )  # fmt: skip
    logging.getLogger("rdmad.kernel").error("write failed: %s", f"{NETDEV} {NEWLINE}")
    text = stream.getvalue()
    assert text.count("\n") == 2, text  # two records, two lines
    assert raw_controls(text) == [], text
    assert "pwned" in text and "STOPPING=1" in text  # escaped, not dropped


@pytest.mark.usefixtures("own_logging")
def test_json_logs_keep_the_exact_string() -> None:
    stream = io.StringIO()
    logs.configure("info", "json", stream=stream, journald=False)
    structlog.get_logger("rdmad.agent").warning("object.blocked", reason=COMM)
    assert json.loads(stream.getvalue())["reason"] == COMM


# --- the guard and the doctor -----------------------------------------------------------------


def test_guard_refusal_and_its_journal_line_carry_no_raw_control_byte(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node: FakeSysfs = mlx5_node(tmp_path)
    node.driver_module("mlx5_core", "mlx5_core")
    node.write("proc/4242/comm", COMM + "\n")  # the qemu holding VF 1 renamed itself
    journal: list[str] = []
    monkeypatch.setattr(cli.syslog, "syslog", lambda prio, msg: journal.append(msg))
    monkeypatch.delenv("RDMAD_GUARD_FORCE", raising=False)
    assert cli.main(["check", "mlx5_core"], root=str(tmp_path)) == cli.EXIT_REFUSED
    err = capsys.readouterr().err
    assert "pid 4242 (\\x1b]0;pwned\\x07)" in err, err
    assert raw_controls(err) == []
    assert journal and all(raw_controls(m) == [] and "\n" not in m for m in journal), journal
    assert "pwned" in journal[0]


def test_guard_journal_line_is_escaped_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    monkeypatch.setattr(cli.syslog, "syslog", lambda prio, msg: sent.append(msg))
    cli._journal(4, f"refused: pid 1 ({NEWLINE}{COMM})")
    assert sent == ["refused: pid 1 (x\\nSTOPPING=1\\x1b]0;pwned\\x07)"]


def test_doctor_lines_escape_what_the_host_names() -> None:
    report = Report(
        (Check("rdma-devices", "warn", f"device {NETDEV}", (f"{COMM}: port 1",), CONFIG_VALUE),),
        unread=(f"/sys/class/infiniband/{COMM}: Permission denied",),
    )
    for line in report.lines():
        assert raw_controls(line) == [], line


def test_a_snapshot_with_hostile_names_is_valid_toml_without_controls() -> None:
    """Its comments quote names and notes (an rxe link without netdev, a PF netdev): a
    control character there drove the terminal and made the file invalid TOML."""
    observed = Observed(
        pfs=(
            PfObserved(
                "0000:3b:00.0",
                "igb",
                NETDEV,
                3,
                None,
                None,
                numvfs=1,
                totalvfs=7,
                vfs=(VfObserved(0, "0000:3b:10.0"),),
            ),
        ),
        rdma_links=(
            RdmaLinkObserved(f"rx{COMM}", "rxe", None),
            RdmaLinkObserved("rxe1", "rxe", NETDEV),
        ),
        notes=(f"open files of pid 7 ({COMM}) could not be read",),
    )
    text = snapshot(observed, header=f"from {NETDEV}")
    assert raw_controls(text) == [], text
    doc = tomllib.loads(text)
    assert "eth\\x9b2J0" in text and "rx\\x1b]0;pwned\\x07" in text  # comments, escaped
    assert doc["rxe"] == [{"name": "rxe1", "netdev": {"name": NETDEV}}]  # values exact
