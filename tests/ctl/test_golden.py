"""What an operator reads: rdmad-ctl's table and JSON for fixture daemons, compared
exactly with tests/ctl/golden/ (regenerate: RDMAD_UPDATE_GOLDEN=1 pytest tests/ctl).

Each golden file holds the command, its exit code, stdout and stderr; temp paths
read <TMP>.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rdmad.state import State, StateStore
from rdmad.status import HistoryEntry
from tests.ctl.conftest import BOOT_ID, NOW, ApiStub, Result, ctl

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("RDMAD_UPDATE_GOLDEN") == "1"

STATUS_CASES = ["converged", "blocked", "unsupported", "degraded", "peermem"]


def check_golden(name: str, argv: list[str], result: Result, tmp: Path) -> None:
    text = (
        f"$ rdmad-ctl {' '.join(argv)}\nexit: {result.code}\n"
        f"--- stdout\n{result.out}--- stderr\n{result.err}"
    ).replace(str(tmp), "<TMP>")
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"no golden file {path}: run with RDMAD_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name}: output differs from {path}"


@pytest.mark.parametrize("case", STATUS_CASES)
@pytest.mark.parametrize("variant", [[], ["-v"], ["--json"]], ids=["table", "verbose", "json"])
def test_status(api: ApiStub, short_dir: Path, case: str, variant: list[str]) -> None:
    doc = api.fixture("GET /v1/status", f"status-{case}.json")
    argv = ["status", *variant]
    result = ctl(*argv, socket=api.socket)
    suffix = {"": "", "-v": "-verbose", "--json": "-json"}["".join(variant)]
    check_golden(f"status-{case}{suffix}", argv, result, short_dir)
    assert result.code == (0 if doc["converged"] else 1)
    assert result.err == ""


def _saved_state(directory: Path) -> None:
    """A state file as the daemon writes it (rdmad.state's own writer)."""
    history = [
        HistoryEntry(NOW - 7200, "start", reason="rdmad 0.1.0 started", cause="boot"),
        HistoryEntry(
            NOW - 7190,
            "applied",
            "sriov pci=0000:3b:00.0",
            "sriov_numvfs: 0 -> 4",
            "declared 4 VFs, the kernel has 0",
            "boot",
            kind="set-numvfs",
        ),
        HistoryEntry(
            NOW - 7189,
            "applied",
            "rxe rxe0",
            "rxe rxe0: absent -> on eth0",
            "declared rxe0 on eth0 is missing",
            "boot",
            kind="add-rxe",
        ),
        HistoryEntry(
            NOW - 900,
            "failed",
            "sriov pci=0000:3b:00.0",
            "sriov_numvfs: 4 -> 0",
            "declared 8 VFs, the kernel has 4",
            "sighup",
            error="Device or resource busy",
            errno=16,
            kind="set-numvfs",
        ),
    ]
    state = State(
        boot_id=BOOT_ID,
        managed_rxe={"rxe0"},
        applied={
            "sriov pci=0000:3b:00.0": {
                "what": "sriov_numvfs: 0 -> 4",
                "at": NOW - 7190,
                "reason": "declared 4 VFs",
                "cause": "boot",
            },
            "rxe rxe0": {
                "what": "rxe rxe0: absent -> on eth0",
                "at": NOW - 7189,
                "reason": "declared rxe0 on eth0 is missing",
                "cause": "boot",
            },
        },
        last_errors={
            "sriov pci=0000:3b:00.0": {
                "error": "sriov_numvfs: Device or resource busy",
                "at": NOW - 900,
                "failures": 2,
            }
        },
        history=history,
        started_at=NOW - 7200,
    )
    assert StateStore(directory).save(state) is None
    os.utime(directory / "state.json", (NOW - 300, NOW - 300))


@pytest.mark.parametrize("saved", [True, False], ids=["state", "nostate"])
@pytest.mark.parametrize("variant", [[], ["--json"]], ids=["table", "json"])
def test_status_when_the_daemon_is_down(short_dir: Path, saved: bool, variant: list[str]) -> None:
    state_dir = short_dir / "state"
    state_dir.mkdir()
    if saved:
        _saved_state(state_dir)
    argv = ["status", *variant]
    result = ctl(*argv, socket=str(short_dir / "absent.sock"), state_dir=str(state_dir))
    name = f"status-down-{'state' if saved else 'nostate'}{'-json' if variant else ''}"
    check_golden(name, argv, result, short_dir)
    assert result.code == 3
    assert "rdmad is not running" in result.err and "systemctl start rdmad" in result.err


def test_history_when_the_daemon_is_down_reads_the_state_file(short_dir: Path) -> None:
    _saved_state(short_dir)
    argv = ["history", "sriov pci=0000:3b:00.0", "--since", "3h"]
    result = ctl(*argv, socket=str(short_dir / "absent.sock"), state_dir=str(short_dir))
    check_golden("history-down", argv, result, short_dir)
    assert result.code == 3


@pytest.mark.parametrize(
    ("name", "route", "fixture_name", "argv", "code"),
    [
        ("plan", "GET /v1/plan", "plan.json", ["plan"], 1),  # an object stays blocked
        ("history", "GET /v1/history", "history.json", ["history"], 0),
        ("config", "GET /v1/config", "config.json", ["config"], 0),
        ("snapshot", "GET /v1/snapshot", "snapshot.json", ["snapshot"], 0),
    ],
)
def test_other_commands(
    api: ApiStub,
    short_dir: Path,
    name: str,
    route: str,
    fixture_name: str,
    argv: list[str],
    code: int,
) -> None:
    api.fixture(route, fixture_name)
    result = ctl(*argv, socket=api.socket)
    check_golden(name, argv, result, short_dir)
    assert result.code == code
