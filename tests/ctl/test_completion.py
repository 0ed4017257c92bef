"""The completions of rdmad and rdmad-ctl (completion/: bash, zsh, fish) in the real shells:
what each offers is what the argument parsers accept (sub-commands, every visible option
of each), plus the values they know (choices, --since suggestions, the daemon's object
names from a fixture API server); and the shipped files are what rdmad/completions.py
makes from the parsers now."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rdmad import cli, completions
from rdmad.ctl import args as ctl_args
from tests.ctl.conftest import REPO, ApiStub, ctl_env

DIR = REPO / "completion"
SHELLS = ("bash", "zsh", "fish")
Complete = Callable[[str, str], set[str]]  # (shell, command line) -> what the shell offers


def _shell(name: str) -> str:
    """The shell's path; without it the test skips (a failure where tests are required:
    scripts/pkg-deps.sh installs zsh and fish)."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (scripts/pkg-deps.sh installs it)")
    return path


@pytest.fixture
def complete(short_dir: Path) -> Complete:
    bin_dir = short_dir / "bin"
    bin_dir.mkdir()
    for prog, module in (("rdmad-ctl", "rdmad.ctl"), ("rdmad", "rdmad.cli")):
        wrapper = bin_dir / prog
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m {module} "$@"\n')
        wrapper.chmod(0o755)
    env = ctl_env()
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"

    def run(shell: str, line: str) -> set[str]:
        prog = line.split(maxsplit=1)[0]
        if shell == "bash":
            func = "_" + prog.replace("-", "_")
            script = (
                f"source {DIR / (prog + '.bash')}\n"
                'COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}\n'
                f"{func}\n"
                'printf "%s\\n" "${COMPREPLY[@]}"\n'
            )
            cmd = [_shell("bash"), "-c", script, "bash", line]
        elif shell == "fish":
            script = f"source {DIR / (prog + '.fish')}; complete -C $argv[1]"
            cmd = [_shell("fish"), "--no-config", "-c", script, line]
        else:
            capture = Path(__file__).with_name("zsh_capture.zsh")
            cmd = [_shell("zsh"), "-f", str(capture), str(DIR), line]
        out = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=60, check=True
        ).stdout
        return {w.split("\t")[0] for w in out.splitlines() if w.strip()}

    return run


def _sub(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no sub-commands")


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for a in parser._actions
        if a.help != argparse.SUPPRESS
        for flag in a.option_strings
        if flag.startswith("--")
    }


PARSERS = {"rdmad": cli.parser, "rdmad-ctl": ctl_args.parser}


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("prog", sorted(PARSERS))
def test_commands_and_every_option_are_the_parsers(
    complete: Complete, shell: str, prog: str
) -> None:
    parser = PARSERS[prog]()
    commands = _sub(parser)
    offered = complete(shell, f"{prog} ")
    assert set(commands) <= offered, (shell, offered)
    assert offered - set(commands) <= {f for a in parser._actions for f in a.option_strings}
    assert complete(shell, f"{prog} --") == _long_options(parser)
    for name, sub in commands.items():
        assert complete(shell, f"{prog} {name} --") == _long_options(sub), (shell, name)


@pytest.mark.parametrize("shell", SHELLS)
def test_values_the_parsers_know(complete: Complete, shell: str) -> None:
    assert complete(shell, "rdmad-ctl re") == {"reload", "reconcile", "resume"}
    assert complete(shell, "rdmad-ctl guard ") == {"check"}
    assert complete(shell, "rdmad-ctl pause --f") == {"--for"}
    assert complete(shell, "rdmad-ctl --json st") == {"status"}
    assert complete(shell, "rdmad-ctl reconcile --w") == {"--wait"}
    assert complete(shell, "rdmad-ctl history --since 1") == {"10m", "1h", "1d"}
    assert complete(shell, "rdmad-ctl doctor --r") == {"--root"}
    assert complete(shell, "rdmad pl") == {"plan"}
    assert complete(shell, "rdmad run --log-format ") == {"auto", "json", "logfmt", "console"}
    assert complete(shell, "rdmad run --log-level w") == {"warning"}


@pytest.mark.parametrize("shell", SHELLS)
def test_guard_offers_the_pci_drivers(complete: Complete, shell: str) -> None:
    drivers = (
        set(os.listdir("/sys/bus/pci/drivers")) if os.path.isdir("/sys/bus/pci/drivers") else set()
    )
    assert complete(shell, "rdmad-ctl guard check ") == drivers


@pytest.mark.parametrize("shell", SHELLS)
def test_history_objects_from_the_daemon(complete: Complete, api: ApiStub, shell: str) -> None:
    api.fixture("GET /v1/status", "status-blocked.json")
    line = f"rdmad-ctl --socket {api.socket} history "
    assert complete(shell, line) == {"rxe", "sriov"}
    assert complete(shell, line + "rxe ") == {"rxe0"}
    assert complete(shell, line + "sriov ") == {"pci=0000:00:03.0"}


def test_bash_keeps_equals_and_colons_in_a_pf_reference(complete: Complete, api: ApiStub) -> None:
    api.fixture("GET /v1/status", "status-blocked.json")
    line = f"rdmad-ctl --socket {api.socket} history "
    # readline replaces what follows the last '=' or ':' of the word being completed.
    assert complete("bash", line + "sriov pci=00") == {"0000:00:03.0"}
    assert complete("bash", line + "sriov pci=0000:00:0") == {"03.0"}
    assert complete("bash", line + "rxe r") == {"rxe0"}


@pytest.mark.parametrize("shell", SHELLS)
def test_no_daemon_no_objects(complete: Complete, short_dir: Path, shell: str) -> None:
    offered = complete(shell, f"rdmad-ctl --socket {short_dir}/absent.sock history ")
    # zsh offers the options where no value is there to offer; none offers a name.
    assert {w for w in offered if not w.startswith("-")} == set()


def test_the_shipped_files_are_what_the_parsers_make() -> None:
    made = completions.files()
    assert sorted(made) == sorted(p.name for p in DIR.iterdir())
    for name, text in made.items():
        assert (DIR / name).read_text() == text, (
            f"completion/{name}: run python -m rdmad.completions"
        )


def test_check_says_how_to_make_them_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert completions.main(["--out", str(tmp_path)]) == 0
    assert completions.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "_rdmad").write_text("#compdef rdmad\n")
    assert completions.main(["--out", str(tmp_path), "--check"]) == 1
    assert "run: python -m rdmad.completions" in capsys.readouterr().err
