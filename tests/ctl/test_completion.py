"""completion/rdmad-ctl.bash in a real bash: commands, options, and object names from
a fixture daemon, completed word by word."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.ctl.conftest import REPO, ApiStub, ctl_env

SCRIPT = REPO / "completion" / "rdmad-ctl.bash"
Complete = Callable[[str], list[str]]  # a command line -> what bash would offer


@pytest.fixture
def complete(short_dir: Path) -> Complete:
    bin_dir = short_dir / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "rdmad-ctl"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m rdmad.ctl "$@"\n')
    wrapper.chmod(0o755)
    bash = shutil.which("bash")
    assert bash is not None

    def run(line: str) -> list[str]:
        script = (
            f"source {SCRIPT}\n"
            'COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}\n'
            "_rdmad_ctl\n"
            'printf "%s\\n" "${COMPREPLY[@]}"\n'
        )
        env = ctl_env()
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
        out = subprocess.run(
            [bash, "-c", script, "bash", line],
            capture_output=True, text=True, env=env, timeout=60, check=True,
        ).stdout  # fmt: skip
        return [w for w in out.splitlines() if w]

    return run


def test_commands_and_options(complete: Complete) -> None:
    assert complete("rdmad-ctl re") == ["reload", "reconcile", "resume"]
    assert complete("rdmad-ctl guard ") == ["check"]
    assert complete("rdmad-ctl pause --f") == ["--for"]
    assert complete("rdmad-ctl --json st") == ["status"]
    assert "--verbose" in complete("rdmad-ctl status --")
    assert complete("rdmad-ctl reconcile --w") == ["--wait"]
    assert complete("rdmad-ctl history --since 1") == ["10m", "1h", "1d"]


def test_history_objects_from_the_daemon(complete: Complete, api: ApiStub) -> None:
    api.fixture("GET /v1/status", "status-blocked.json")
    line = f"rdmad-ctl --socket {api.socket} history "
    assert complete(line) == ["rxe", "sriov"]
    assert complete(line + "sriov ") == ["pci=0000:00:03.0"]
    # readline replaces what follows the last '=' or ':' of the word being completed.
    assert complete(line + "sriov pci=00") == ["0000:00:03.0"]
    assert complete(line + "sriov pci=0000:00:0") == ["03.0"]
    assert complete(line + "rxe r") == ["rxe0"]


def test_no_daemon_no_objects(complete: Complete, short_dir: Path) -> None:
    assert complete(f"rdmad-ctl --socket {short_dir}/absent.sock history ") == []


def test_doctor_and_its_options(complete: Complete) -> None:
    assert complete("rdmad-ctl do") == ["doctor"]
    assert complete("rdmad-ctl doctor --r") == ["--root"]
    assert complete("rdmad-ctl doctor --c") == ["--config"]
