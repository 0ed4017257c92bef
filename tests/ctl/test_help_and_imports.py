"""`--help` works for every command and documents what scripts rely on; rdmad-ctl
loads nothing but the standard library and its own package."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rdmad.ctl.args import COMMANDS, _command_in
from tests.ctl.conftest import ctl, ctl_env


def test_top_level_help_is_a_man_page() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "rdmad.ctl", "--help"],
        capture_output=True, text=True, env=ctl_env(), timeout=60, check=True,
    ).stdout  # fmt: skip
    for command in COMMANDS:
        assert f"\n    {command} " in out, command
    for words in ("exit codes (rdmad and rdmad-ctl):", "  3  rdmad is not running",
                  "  4  permission denied", "  6  the config is invalid",
                  "examples:", "files:", "environment:", "RDMAD_SOCKET", "NO_COLOR",
                  "/var/lib/rdmad/state.json", "/run/rdmad/rdmad.sock"):  # fmt: skip
        assert words in out, words


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_help_with_examples(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        ctl(command, "--help")
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rdmad-ctl {command}")
    assert "examples:" in out and f"rdmad-ctl {command}" in out
    assert "--socket PATH" in out and "--json" in out


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["status"], "status"),
        (["--socket", "status", "history"], "history"),  # a socket named "status"
        (["--timeout", "3", "--json", "plan", "--socket", "x"], "plan"),
        (["--socket=/x", "watch"], "watch"),
        (["stauts"], None),
        (["--help"], None),
    ],
)
def test_the_command_is_read_as_argparse_reads_it(argv: list[str], command: str | None) -> None:
    assert _command_in(argv) == command


def test_a_misspelt_command_lists_the_real_ones(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ctl("stauts")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    # argparse quotes the choices up to Python 3.12 ('reconcile'), not from 3.13 on.
    assert "invalid choice: 'stauts'" in err
    assert re.search(r"choose from .*\breconcile\b", err), err


# Runs each command in a fresh interpreter (rdmad not running), then prints the
# modules that came from outside the standard library, and the slow stdlib ones.
LOADED = """
import contextlib, io, sys
before = set(sys.modules)
from rdmad.ctl import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    for cmd in ("status", "plan", "history", "config"):
        main(["--socket", "/nonexistent", "--state-dir", "/nonexistent", cmd])
loaded = set(sys.modules) - before
print(" ".join(sorted(m for m in loaded if m.split(".")[0] not in sys.stdlib_module_names)))
slow = ("typing", "http.client", "dataclasses", "shutil", "datetime", "email")
print(" ".join(m for m in slow if m in loaded))
"""


def test_rdmad_ctl_loads_only_the_standard_library() -> None:
    """Every module a run of each command loads (not just what the code names at the
    top): the daemon's stack would cost rdmad-ctl its fast start."""
    out = subprocess.run(
        [sys.executable, "-c", LOADED],
        capture_output=True, text=True, env=ctl_env(), timeout=60, check=True,
    ).stdout.splitlines()  # fmt: skip
    ours = set(out[0].split())
    # rdmad.text (escaping), rdmad.exits (the exit codes `rdmad` returns too) and
    # rdmad.pathkeys (what a path in the config must be), all standard library only, are
    # the modules it shares with others.
    shared = ("rdmad", "rdmad.text", "rdmad.exits", "rdmad.pathkeys")
    outside = {m for m in ours if m not in shared and not m.startswith("rdmad.ctl")}
    assert outside == set()
    assert out[1] == "", "slow stdlib modules crept into rdmad-ctl's start"
