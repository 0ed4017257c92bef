"""rdmad-ctl's commands against a fixture daemon: what they ask, their exit codes, and
that every broken answer becomes one clear line and exit 1, never a traceback."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rdmad import exits
from rdmad.api import routes
from rdmad.ctl import args, commands, unitstate
from rdmad.ctl.render.formats import table
from tests.ctl.conftest import NOW, ApiStub, Reply, Result, ctl, ctl_process, fixture

# --- what status means for scripts ----------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "code"),
    [("converged", 0), ("blocked", 1), ("unsupported", 0), ("degraded", 1)],
)
def test_status_exit_code_follows_converged(api: ApiStub, case: str, code: int) -> None:
    api.fixture("GET /v1/status", f"status-{case}.json")
    assert ctl("status", socket=api.socket).code == code
    assert ctl("status", "--json", socket=api.socket).code == code
    assert api.requests == [("GET", "/v1/status")] * 2


def test_blocked_status_names_the_holder(api: ApiStub) -> None:
    api.fixture("GET /v1/status", "status-blocked.json")
    out = ctl("status", socket=api.socket).out
    held_by = next(line for line in out.splitlines() if "held by" in line)
    assert "pid 1234 (qemu-system-x86) holds /dev/vfio/42" in held_by
    assert "VF 3" in out and "VF 0" not in out  # only what is not converged, without -v
    assert "VF 0" in ctl("status", "-v", socket=api.socket).out


def test_status_json_is_the_api_document(api: ApiStub) -> None:
    doc = api.fixture("GET /v1/status", "status-blocked.json")
    assert json.loads(ctl("status", "--json", socket=api.socket).out) == doc


def test_options_before_or_after_the_command(api: ApiStub) -> None:
    doc = api.fixture("GET /v1/status", "status-converged.json")
    before = ctl("--json", "--socket", api.socket, "status")
    after = ctl("status", "--socket", api.socket, "--json")
    assert json.loads(before.out) == json.loads(after.out) == doc


def test_socket_from_the_environment(api: ApiStub, monkeypatch: pytest.MonkeyPatch) -> None:
    api.fixture("GET /v1/status", "status-converged.json")
    monkeypatch.setenv("RDMAD_SOCKET", api.socket)
    assert ctl("status").code == 0
    assert api.requests == [("GET", "/v1/status")]


def test_degraded_shows_errno_and_retry(api: ApiStub) -> None:
    api.fixture("GET /v1/status", "status-degraded.json")
    out = ctl("status", socket=api.socket).out.splitlines()
    line = next(ln for ln in out if ln.startswith("degraded"))
    assert "ENOMEM (12)" in line and "3 failure(s)" in line and "retry in 40s" in line


# --- the daemon is not there ------------------------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "watch", "reload", "reconcile", "snapshot", "config"])
def test_every_command_says_when_rdmad_is_not_running(short_dir: Path, command: str) -> None:
    result = ctl(command, socket=str(short_dir / "absent.sock"))
    assert result.code == exits.NOT_RUNNING
    assert "rdmad is not running (no socket at" in result.err
    assert "systemctl start rdmad" in result.err and "journalctl -u rdmad" in result.err
    assert result.out == ""


def test_a_socket_nobody_listens_on_is_not_running(short_dir: Path) -> None:
    path = short_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))  # left behind by a daemon that died: bound, not listening
        result = ctl("status", socket=str(path), state_dir=str(short_dir))
    assert result.code == exits.NOT_RUNNING
    assert f"nothing listens at {path}" in result.err


def test_corrupt_state_file_is_reported_not_raised(short_dir: Path) -> None:
    (short_dir / "state.json").write_text("{not json")
    result = ctl("status", socket=str(short_dir / "absent.sock"), state_dir=str(short_dir))
    assert result.code == exits.NOT_RUNNING
    assert "is corrupt (not JSON" in result.out


# --- broken and refused answers ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (Reply(200, b"<html>hello</html>", "text/html"), "not JSON: <html>hello</html>"),
        (Reply(200, b"[1, 2]"), "is not a JSON object"),
        (Reply(200, b'{"api": 1}'), "lacks objects, converged"),
        (Reply(200, b'{"api": 1, "objects": 3, "converged": false}'), "not what this rdmad-ctl"),
        (
            Reply(500, b'{"error": {"status": 500, "code": "internal", "message": "boom"}}'),
            "answered /v1/status with 500 internal: boom",
        ),
        (Reply(500, b"Internal Server Error", "text/plain"), "500: Internal Server Error"),
        (
            Reply(503, b'{"error": {"status": 503, "code": "unavailable", "message": "starting"}}'),
            "cannot answer /v1/status now (503 unavailable): starting",
        ),
        (Reply(0), "closed the connection without answering"),
    ],
    ids=["html", "list", "missing-keys", "wrong-types", "500-json", "500-text", "503", "hangup"],
)
def test_malformed_answers_are_one_clear_line(api: ApiStub, reply: Reply, words: str) -> None:
    api.routes["GET /v1/status"] = reply
    result = ctl("status", socket=api.socket)
    assert result.code == exits.FAIL
    assert words in result.err
    assert "Traceback" not in result.err and result.out == ""
    assert result.err.count("\n") == 1


def test_forbidden_names_the_group(api: ApiStub) -> None:
    api.error("POST /v1/reload", 403, "forbidden", "uid 1000 may not reload")
    result = ctl("reload", socket=api.socket)
    assert result.code == exits.DENIED
    assert "uid 1000 may not reload" in result.err
    assert "read group (default `rdmad`" in result.err and "write_group" in result.err


def test_a_stuck_daemon_times_out(api: ApiStub) -> None:
    api.routes["GET /v1/config"] = Reply(200, b"{}", hold=threading.Event())
    result = ctl("config", "--timeout", "0.3", socket=api.socket)
    assert result.code == exits.NO_ANSWER  # not 1: a probe must tell hung from unhappy
    assert "did not answer /v1/config within 0.3 s" in result.err


def test_a_stuck_daemon_is_not_an_unconverged_one(api: ApiStub) -> None:
    """The DaemonSet's liveness probe (`[ $? -le 1 ]`) keeps a daemon that answers "not
    converged" and restarts one that does not answer."""
    api.routes["GET /v1/status"] = Reply(200, b"{}", hold=threading.Event())
    stuck = ctl("status", "--timeout", "0.3", socket=api.socket)
    assert stuck.code == exits.NO_ANSWER and stuck.code > 1
    probe = deploy_probe()
    assert "rdmad-ctl status --timeout 5" in probe

    def probed(code: int) -> int:
        answer = probe.replace("rdmad-ctl status --timeout 5", f"(exit {code})")
        return subprocess.run(["sh", "-c", answer], check=False).returncode

    assert [probed(c) for c in (0, 1, exits.NOT_RUNNING, stuck.code)] == [0, 0, 1, 1]


def deploy_probe() -> str:
    """The DaemonSet's liveness probe, the shell command it runs."""
    path = Path(__file__).resolve().parents[2] / "deploy/kubernetes/daemonset-gpu.yaml"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    [daemonset] = [d for d in docs if d.get("kind") == "DaemonSet"]
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    [probe] = [c["livenessProbe"] for c in containers if "livenessProbe" in c]
    return str(probe["exec"]["command"][2])


# --- the other commands ------------------------------------------------------------------------


def test_history_passes_its_filters(api: ApiStub) -> None:
    api.fixture("GET /v1/history", "history.json")
    result = ctl(
        "history", "sriov pci=0000:3b:00.0", "--since", "1h30m", "--limit", "5", socket=api.socket
    )
    assert result.code == 0
    ((method, path),) = api.requests
    since = NOW - 5400
    assert (method, path) == (
        "GET",
        f"/v1/history?obj=sriov+pci%3D0000%3A3b%3A00.0&since={since}&limit=5",
    )


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("@1795000000", 1795000000.0),
        ("2026-11-18T08:00:00", NOW - 11400),  # NOW is 2026-11-18 11:10:00 UTC
        ("2d", NOW - 172800),
        ("45s", NOW - 45),
    ],
)
def test_history_since_forms(api: ApiStub, spec: str, want: float) -> None:
    api.fixture("GET /v1/history", "history.json")
    assert ctl("history", "--since", spec, socket=api.socket).code == 0
    assert api.requests[0][1] == f"/v1/history?since={want}"


@pytest.mark.parametrize(
    "argv",
    [
        ["history", "--since", "90"],
        ["history", "--since", "yesterday"],
        ["history", "--limit", "0"],
        ["reload", "--wait", "-1"],
        ["wait", "--within", "-1"],
        ["wait", "--within", "soon"],
        ["wait", "--within", "inf"],
        ["status", "--timeout", "soon"],
        # Past a socket's own bound (~9e9 s) these raised OverflowError with a traceback;
        # 0 made the socket non-blocking: every request failed at once, blamed on rdmad
        # ("rdmad closed the connection without answering").
        ["status", "--timeout", "1e10"],
        ["status", "--timeout", "3601"],
        ["status", "--timeout", "0"],
        ["reload", "--wait", "1e10"],
        ["reconcile", "--wait", "601"],
        ["frobnicate"],
        [],
    ],
)
def test_usage_errors_exit_2_and_ask_nothing(
    api: ApiStub, argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        code = ctl(*argv, socket=api.socket).code
        raise SystemExit(code)
    assert exc.value.code == exits.USAGE
    assert api.requests == []
    assert "usage: rdmad-ctl" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["reload", "reconcile"])
def test_mutations_wait_for_their_pass(api: ApiStub, what: str) -> None:
    api.fixture("GET /v1/status", "status-blocked.json")  # the config is valid
    answer = {"api": 1, "queued": True, "pass": 15, "seconds": 0.004,
              "summary": "1 object(s), 1 blocked; ...", "converged": False}  # fmt: skip
    api.json(f"POST /v1/{what}", answer)
    result = ctl(what, "--wait", "12", socket=api.socket)
    assert api.requests[0] == ("POST", f"/v1/{what}?wait=12")
    # A reload then checks the daemon took the config: the status lists its errors.
    assert api.requests[1:] == ([("GET", "/v1/status")] if what == "reload" else [])
    assert result.code == exits.FAIL  # answered, and the node is not converged
    assert result.out.startswith(f"{what}: pass 15 (4 ms): NOT converged")
    api.json(f"POST /v1/{what}", {**answer, "converged": True})
    assert ctl(what, socket=api.socket).code == exits.OK
    assert ("POST", f"/v1/{what}?wait=30") in api.requests


def test_the_largest_timeout_and_wait_are_asked_and_the_wait_is_the_apis_bound(
    api: ApiStub,
) -> None:
    api.fixture("GET /v1/status", "status-converged.json")
    answer = {"api": 1, "queued": True, "pass": 3, "seconds": 0.004,
              "summary": "1 object(s), 1 converged", "converged": True}  # fmt: skip
    api.json("POST /v1/reconcile", answer)
    assert ctl("status", "--timeout", "3600", socket=api.socket).code == exits.OK
    assert ctl("reconcile", "--wait", "600", socket=api.socket).code == exits.OK
    assert api.requests == [("GET", "/v1/status"), ("POST", "/v1/reconcile?wait=600")]
    assert args.MUTATION_WAIT_MAX == routes.MUTATION_WAIT_MAX


def test_reload_of_an_invalid_config_exits_6_with_its_errors(api: ApiStub) -> None:
    status = fixture("status-converged.json")
    status["daemon"]["config_errors"] = ["/etc/rdmad/rdmad.toml: sriov[0].numvfs: not an int"]
    api.json("GET /v1/status", status)
    api.json("POST /v1/reload", {"api": 1, "queued": True, "pass": 15, "seconds": 0.004,
                                 "summary": "2 object(s), 2 converged; config invalid",
                                 "converged": True})  # fmt: skip
    result = ctl("reload", socket=api.socket)
    assert result.code == exits.CONFIG_INVALID
    assert result.err == (
        "rdmad-ctl: the config is invalid (1 error(s)); the last good config is kept:\n"
        "  /etc/rdmad/rdmad.toml: sriov[0].numvfs: not an int\n"
    )
    # With --json: the reload's answer with the error object in it, one document.
    result = ctl("reload", "--json", socket=api.socket)
    assert result.code == exits.CONFIG_INVALID
    assert json.loads(result.out)["error"] == {
        "code": "config-invalid",
        "exit": 6,
        "message": "the config is invalid (1 error(s)); the last good config is kept",
        "errors": ["/etc/rdmad/rdmad.toml: sriov[0].numvfs: not an int"],
    }


def test_reconcile_without_waiting(api: ApiStub) -> None:
    api.json("POST /v1/reconcile", {"api": 1, "queued": True, "pass": None})
    result = ctl("reconcile", "--wait", "0", socket=api.socket)
    assert (result.code, result.out) == (0, "reconcile: queued (not waiting for the pass)\n")


def test_snapshot_to_a_file(api: ApiStub, short_dir: Path) -> None:
    doc = api.fixture("GET /v1/snapshot", "snapshot.json")
    target = short_dir / "50-snapshot.toml"
    target.write_text("old")
    result = ctl("snapshot", "-o", str(target), socket=api.socket)
    assert result.code == 0 and result.out == ""
    assert target.read_text() == doc["toml"]
    assert sorted(p.name for p in short_dir.iterdir()) == ["50-snapshot.toml", "rdmad.sock"]


def test_snapshot_to_an_unwritable_place_changes_nothing(api: ApiStub, short_dir: Path) -> None:
    api.fixture("GET /v1/snapshot", "snapshot.json")
    result = ctl("snapshot", "-o", str(short_dir / "nodir" / "x.toml"), socket=api.socket)
    assert result.code == exits.FAIL and "cannot write" in result.err
    assert sorted(p.name for p in short_dir.iterdir()) == ["rdmad.sock"]


def test_invalid_config_exits_6(api: ApiStub) -> None:
    doc = fixture("config.json")
    api.json("GET /v1/config", {**doc, "ok": False, "errors": ["rdmad.toml: sriov[0].numvfs: -1"]})
    result = ctl("config", socket=api.socket)
    assert result.code == exits.CONFIG_INVALID
    assert "config INVALID (1 error(s))" in result.out
    result = ctl("config", "--json", socket=api.socket)
    assert result.code == exits.CONFIG_INVALID
    assert json.loads(result.out)["error"]["code"] == "config-invalid"


def test_plan_json_is_the_api_document(api: ApiStub) -> None:
    doc = api.fixture("GET /v1/plan", "plan.json")
    result = ctl("plan", "--json", socket=api.socket)
    # The fixture's plan leaves an object blocked: exit 1, as `rdmad plan`.
    assert (result.code, json.loads(result.out)) == (exits.FAIL, doc)


def test_a_plan_that_reaches_the_declaration_exits_0(api: ApiStub) -> None:
    doc = fixture("plan.json")
    doc["objects"] = [o for o in doc["objects"] if o["state"] != "blocked"]
    api.json("GET /v1/plan", doc)
    assert ctl("plan", socket=api.socket).code == exits.OK  # changes to make are fine


def test_long_reasons_are_cut_to_a_terminal_but_never_in_a_pipe() -> None:
    rows = [
        ["STATE", "OBJECT", "REASON"],
        ["blocked", "sriov x", "r" * 200],
        ["converged", "y", ""],
    ]
    cut = table(rows, width=60)
    assert [len(line) for line in cut] == [26, 60, 12]
    assert cut[1].endswith("r…")
    assert table(rows, width=30)[1].endswith("r" * 200)  # 10 columns left: wrapping reads better
    assert table(rows)[1].endswith("r" * 200)


def test_a_reader_that_goes_away_is_no_error_to_report(api: ApiStub) -> None:
    """`rdmad-ctl history | head -1`: the rest of the output has nowhere to go."""
    entry = fixture("history.json")["entries"][1]
    api.json("GET /v1/history", {"api": 1, "entries": [entry] * 3000})  # > a pipe's buffer
    proc = ctl_process("--socket", api.socket, "history")
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith("TIME")
    proc.stdout.close()
    assert proc.wait(30) == exits.FAIL
    with proc.stderr:
        assert proc.stderr.read() == ""


# --- wait -----------------------------------------------------------------------------------


def ctl_beside(api: ApiStub, change: Callable[[], None], *argv: str) -> Result:
    """`rdmad-ctl ARGV` against ``api`` while ``change`` runs in a thread beside it,
    changing the stub's answers as the requests come."""
    helper = threading.Thread(target=change)
    helper.start()
    try:
        return ctl(*argv, socket=api.socket)
    finally:
        helper.join(10)


def test_wait_returns_once_converged_and_asks_the_daemon_to_hold_the_answer(
    api: ApiStub,
) -> None:
    """The first answer is not converged, the next one is: exit 0 with the summary; each
    request asks the daemon to hold it (?wait=), at most WAIT_STEP seconds."""
    api.fixture("GET /v1/status", "status-blocked.json")

    def converge_after_the_first_request() -> None:
        for _ in range(1000):
            if api.requests:
                api.fixture("GET /v1/status", "status-converged.json")
                return
            threading.Event().wait(0.01)

    result = ctl_beside(api, converge_after_the_first_request, "wait", "--within", "30")
    assert result.code == exits.OK, result
    assert re.fullmatch(r"converged after \d+\.\d s: .*converged.*\n", result.out), result.out
    assert len(api.requests) >= 2
    for method, path in api.requests:
        assert method == "GET" and path.startswith("/v1/status?wait=")
        assert 0 < float(path.split("=", 1)[1]) <= 5


def test_wait_gives_up_after_within_and_says_what_is_missing(api: ApiStub) -> None:
    api.fixture("GET /v1/status", "status-blocked.json")
    result = ctl("wait", "--within", "0.6", socket=api.socket)
    assert result.code == exits.FAIL
    assert result.err.startswith("rdmad-ctl: not converged within 0.6 s\n")
    assert "blocked" in result.out  # the status of what is not converged
    assert 1 <= len(api.requests) <= 5  # looks, not a spin (WAIT_FLOOR)


def test_wait_does_not_take_a_verdict_older_than_its_request(api: ApiStub) -> None:
    """The daemon says converged, but no pass has ended since the request (answered
    false: one is stuck on a slow write, say): not converged, exit 1, and why."""
    doc = fixture("status-converged.json")
    api.json("GET /v1/status", {**doc, "answered": False})
    result = ctl("wait", "--within", "0.6", socket=api.socket)
    assert result.code == exits.FAIL, result
    assert result.err.startswith("rdmad-ctl: not converged within 0.6 s\n")
    assert "no pass has ended since this asked" in result.err
    result = ctl("wait", "--within", "0.3", "--json", socket=api.socket)
    assert result.code == exits.FAIL
    out = json.loads(result.out)
    assert out["converged"] is False and out["answered"] is False and out["waited"] >= 0.3
    api.json("GET /v1/status", {**doc, "answered": True})
    assert ctl("wait", "--within", "5", socket=api.socket).code == exits.OK


def test_wait_within_0_looks_once(api: ApiStub) -> None:
    api.fixture("GET /v1/status", "status-converged.json")
    result = ctl("wait", "--within", "0", "--json", socket=api.socket)
    assert result.code == exits.OK
    assert api.requests == [("GET", "/v1/status")]
    doc = json.loads(result.out)
    assert doc["converged"] is True and doc["waited"] >= 0


def test_wait_when_rdmad_is_down_or_stops_exits_3(api: ApiStub, short_dir: Path) -> None:
    result = ctl("wait", "--json", socket=str(short_dir / "none.sock"))
    assert result.code == exits.NOT_RUNNING
    assert json.loads(result.out)["error"]["code"] == "not-running"
    api.error("GET /v1/status", 503, "unavailable", "the daemon is stopping")
    result = ctl("wait", socket=api.socket)
    assert result.code == exits.NOT_RUNNING
    assert "rdmad stopped" in result.err and "the daemon is stopping" in result.err


def test_wait_rides_through_a_restart_of_rdmad(api: ApiStub) -> None:
    """rdmad answered (not converged), then died holding the next request (the
    connection closed with no answer), answered 503 while stopping, then its socket was
    gone (systemd's Restart= between two runs), then back, converged: exit 0, not 3. A
    unit ordered after the wait must not fail for a restart that ends in time."""
    api.fixture("GET /v1/status", "status-blocked.json")
    hidden = api.socket + ".away"

    def crash_then_come_back() -> None:
        for _ in range(2000):
            n = len(api.requests)
            if n == 1:
                api.routes["GET /v1/status"] = Reply(0)  # closed without answering
            elif n == 2:
                api.error("GET /v1/status", 503, "unavailable", "the daemon is stopping")
            elif n == 3 and os.path.exists(api.socket):
                os.rename(api.socket, hidden)  # down: nothing listens at the path
                threading.Event().wait(1.2)
                api.fixture("GET /v1/status", "status-converged.json")
                os.rename(hidden, api.socket)
                return
            threading.Event().wait(0.01)

    result = ctl_beside(api, crash_then_come_back, "wait", "--within", "30")
    assert result.code == exits.OK, result
    assert result.out.startswith("converged after"), result.out
    assert len(api.requests) >= 4


def stopping_after_the_first_answer(api: ApiStub) -> Callable[[], None]:
    """A change for ``ctl_beside``: once rdmad answered, it answers 503 (stopping)."""

    def change() -> None:
        for _ in range(1000):
            if api.requests:
                api.error("GET /v1/status", 503, "unavailable", "the daemon is stopping")
                return
            threading.Event().wait(0.01)

    return change


def fake_systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str) -> Path:
    """A systemctl that prints ``answer`` (what `systemctl show` prints) and writes down
    each call; returns the calls' file."""
    calls = tmp_path / "systemctl-calls"
    (tmp_path / "systemctl-answer").write_text(answer)
    script = tmp_path / "systemctl"
    script.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncat {tmp_path / "systemctl-answer"}\n')
    script.chmod(0o755)
    monkeypatch.setattr(unitstate, "SYSTEMCTL", str(script))
    return calls


STOPPED = "LoadState=loaded\nActiveState=inactive\nSubState=dead\nJob=\n"
RESTARTING = "LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nJob=\n"


def in_unit(name: str, unit: str = "rdmad.service") -> dict[str, Any]:
    doc = fixture(name)
    return {**doc, "daemon": {**doc["daemon"], "unit": unit}}


@pytest.mark.parametrize("json_out", [False, True])
def test_wait_exits_3_at_once_when_systemd_says_rdmad_was_stopped(
    api: ApiStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_out: bool
) -> None:
    """`systemctl stop rdmad` while a wait waits: the daemon answers 503 while it stops,
    then nothing listens; systemd says its unit is inactive with no job queued. Nothing
    will converge: exit 3 now, not when --within (60 s here) ends."""
    calls = fake_systemctl(tmp_path, monkeypatch, STOPPED)
    api.json("GET /v1/status", in_unit("status-blocked.json"))

    argv = ["wait", "--within", "60", *(["--json"] if json_out else [])]
    started = time.monotonic()
    result = ctl_beside(api, stopping_after_the_first_answer(api), *argv)
    assert result.code == exits.NOT_RUNNING, result
    assert time.monotonic() - started < 30, "waited for --within"
    assert "rdmad.service was stopped and nothing is starting it again" in result.err
    assert "until --within ended" not in result.err
    if json_out:
        assert json.loads(result.out)["error"]["code"] == "not-running"
    asked = calls.read_text().splitlines()
    assert asked and all(line.endswith("-- rdmad.service") for line in asked), asked
    assert all("--property=ActiveState" in line and "--property=Job" in line for line in asked)


def test_wait_rides_through_systemds_restart_of_rdmad(
    api: ApiStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same loss, but systemd says the unit is in Restart='s wait (activating,
    auto-restart): asked again until rdmad is back and converged, exit 0."""
    calls = fake_systemctl(tmp_path, monkeypatch, RESTARTING)
    api.json("GET /v1/status", in_unit("status-blocked.json"))

    def down_then_back() -> None:
        for _ in range(2000):
            n = len(api.requests)
            if n == 1:
                api.error("GET /v1/status", 503, "unavailable", "the daemon is stopping")
            elif n >= 3:
                api.json("GET /v1/status", in_unit("status-converged.json"))
                return
            threading.Event().wait(0.01)

    result = ctl_beside(api, down_then_back, "wait", "--within", "30")
    assert result.code == exits.OK, result
    assert calls.read_text().count("rdmad.service") >= 1  # asked systemd, then waited on


def test_wait_without_a_unit_never_asks_systemd(
    api: ApiStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon not started by systemd (a shell, the DaemonSet) names no unit: its loss
    is waited out while --within lasts, whatever a unit of that name is doing."""
    calls = fake_systemctl(tmp_path, monkeypatch, STOPPED)
    api.fixture("GET /v1/status", "status-blocked.json")  # no daemon.unit

    result = ctl_beside(api, stopping_after_the_first_answer(api), "wait", "--within", "1.2")
    assert result.code == exits.NOT_RUNNING, result
    assert "until --within ended" in result.err
    assert not calls.exists()


@pytest.mark.parametrize(
    ("show", "stopped"),
    [
        (STOPPED, "rdmad.service was stopped and nothing is starting it again"),
        (
            "LoadState=loaded\nActiveState=failed\nSubState=failed\nJob=\n",
            "rdmad.service failed and systemd is not restarting it (journalctl -u rdmad.service)",
        ),
        (RESTARTING, None),
        ("LoadState=loaded\nActiveState=inactive\nSubState=dead\nJob=317\n", None),  # restart
        ("LoadState=loaded\nActiveState=deactivating\nSubState=stop-sigterm\nJob=260\n", None),
        ("LoadState=loaded\nActiveState=inactive\nSubState=dead\n", None),  # no Job: doubt
        ("LoadState=not-found\nActiveState=inactive\nSubState=dead\nJob=\n", None),
        ("", None),
    ],
)
def test_what_systemd_says_of_the_unit(show: str, stopped: str | None) -> None:
    assert unitstate.verdict("rdmad.service", show) == stopped


STARTING = "LoadState=loaded\nActiveState=activating\nSubState=start\nJob=412\nResult=success\n"
CRASHED = (
    "LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nJob=\n"
    "Result=exit-code\nNRestarts=2\n"
)


@pytest.mark.parametrize(
    ("show", "says", "hint", "coming"),
    [
        (
            CRASHED,
            "failed (exit-code) and systemd starts it again shortly (restart 2)",
            "why it failed: journalctl -u rdmad.service",
            True,
        ),
        (STARTING, "is starting (start)", "`rdmad-ctl wait` waits for it", True),
        (
            "LoadState=loaded\nActiveState=inactive\nSubState=dead\nJob=317\n",
            "is starting",
            "`rdmad-ctl wait`",
            True,
        ),  # a start job queued
        (
            "LoadState=loaded\nActiveState=deactivating\nSubState=stop-sigterm\nJob=260\n",
            "is stopping (stop-sigterm)",
            "journalctl -u rdmad.service",
            True,
        ),
        (STOPPED, "is stopped", "start it: systemctl start rdmad.service", False),
        (
            "LoadState=loaded\nActiveState=failed\nSubState=failed\nJob=\nResult=signal\n",
            "failed (signal) and systemd is not restarting it",
            "systemctl start rdmad.service",
            False,
        ),
        (
            "LoadState=loaded\nActiveState=active\nSubState=running\nJob=\n",
            "is running, but not on this socket",
            "--socket PATH",
            False,
        ),
    ],
)
def test_what_status_says_of_the_unit_when_rdmad_does_not_answer(
    show: str, says: str, hint: str, coming: bool
) -> None:
    got = unitstate.describe("rdmad.service", show)
    assert got is not None
    assert got.says.startswith("rdmad.service ") and says in got.says, got.says
    assert hint in got.hint, got.hint
    assert got.coming is coming


@pytest.mark.parametrize(
    "show", ["LoadState=not-found\nActiveState=inactive\nSubState=dead\nJob=\n", ""]
)
def test_a_unit_systemd_does_not_have_says_nothing(show: str) -> None:
    assert unitstate.describe("rdmad.service", show) is None


@pytest.mark.parametrize("json_out", [False, True])
def test_status_while_systemd_restarts_rdmad_says_so_instead_of_start_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, json_out: bool
) -> None:
    """Nothing answers on the socket during Restart='s wait after a crash: status says
    what systemd says (failed, restarting shortly, why: the journal), not "start it"."""
    calls = fake_systemctl(tmp_path, monkeypatch, CRASHED)
    result = ctl(
        "status",
        *(["--json"] if json_out else []),
        socket=str(tmp_path / "absent.sock"),
        state_dir=str(tmp_path),
    )
    assert result.code == exits.NOT_RUNNING, result
    assert "rdmad is not running (no socket at" in result.err
    assert "rdmad.service failed (exit-code) and systemd starts it again shortly" in result.err
    assert "journalctl -u rdmad.service" in result.err
    assert "systemctl start" not in result.err
    assert calls.read_text().strip().endswith("-- rdmad.service")
    if json_out:
        unit = json.loads(result.out)["unit"]
        assert unit["name"] == "rdmad.service" and "starts it again" in unit["says"]
        assert unit["systemd"]["SubState"] == "auto-restart"
        assert unit["systemd"]["NRestarts"] == "2"


def test_history_and_other_commands_with_rdmad_down_say_what_systemd_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_systemctl(tmp_path, monkeypatch, STOPPED)
    absent = str(tmp_path / "absent.sock")
    for argv in (["history"], ["reconcile"], ["plan"]):
        result = ctl(*argv, socket=absent, state_dir=str(tmp_path))
        assert result.code == exits.NOT_RUNNING, (argv, result)
        assert "rdmad.service is stopped" in result.err, (argv, result.err)
        assert "start it: systemctl start rdmad.service" in result.err


def test_status_without_systemd_says_how_to_start_it(tmp_path: Path) -> None:
    result = ctl("status", "--json", socket=str(tmp_path / "absent.sock"), state_dir=str(tmp_path))
    assert result.code == exits.NOT_RUNNING
    assert commands.START_HINT in result.err
    assert json.loads(result.out)["unit"] is None


def test_wait_asked_while_rdmad_starts_waits_for_it(
    api: ApiStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No socket at the first ask, but systemd says the unit is starting (at boot its
    imports take seconds; `systemctl start --no-block` just before): asked again until
    it answers converged, exit 0, where it exited 3 at once before."""
    calls = fake_systemctl(tmp_path, monkeypatch, STARTING)
    api.json("GET /v1/status", in_unit("status-converged.json"))
    hidden = api.socket + ".starting"
    os.rename(api.socket, hidden)

    def comes_up() -> None:
        for _ in range(2000):
            if calls.exists():  # it found no socket and asked systemd
                os.rename(hidden, api.socket)
                return
            threading.Event().wait(0.01)

    result = ctl_beside(api, comes_up, "wait", "--within", "30")
    assert result.code == exits.OK, result
    assert result.out.startswith("converged after"), result.out


ACTIVE = "LoadState=loaded\nActiveState=active\nSubState=running\nJob=\nResult=success\n"


def systemctl_that_brings_it_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hidden: str, socket_path: str
) -> None:
    """A systemctl asked just as rdmad came up: by the time it answers (active), the
    socket that was not there a moment ago is."""
    script = tmp_path / "systemctl"
    script.write_text(f"#!/bin/sh\nmv {hidden} {socket_path} 2>/dev/null\nprintf '{ACTIVE}'\n")
    script.chmod(0o755)
    monkeypatch.setattr(unitstate, "SYSTEMCTL", str(script))


@pytest.mark.parametrize("command", ["status", "wait"])
def test_rdmad_coming_up_between_the_two_looks_is_asked_again(
    api: ApiStub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """No socket, then systemd says active: READY=1 came in between (rdmad listens
    before it says so). Asked once more, it answers; not "running, but not on this
    socket"."""
    api.json("GET /v1/status", in_unit("status-converged.json"))
    hidden = api.socket + ".binding"
    os.rename(api.socket, hidden)
    systemctl_that_brings_it_up(tmp_path, monkeypatch, hidden, api.socket)
    result = ctl(command, socket=api.socket)
    assert result.code == exits.OK, result
    assert "not on this socket" not in result.err


@pytest.mark.parametrize("command", ["status", "wait"])
def test_rdmad_running_elsewhere_is_said_after_one_more_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    calls = fake_systemctl(tmp_path, monkeypatch, ACTIVE)
    elsewhere = str(tmp_path / "elsewhere.sock")
    argv = ["wait", "--within", "60"] if command == "wait" else ["status"]
    started = time.monotonic()
    result = ctl(*argv, socket=elsewhere, state_dir=str(tmp_path))
    assert result.code == exits.NOT_RUNNING, result
    assert time.monotonic() - started < 10, "waited for --within"
    assert "rdmad.service is running, but not on this socket" in result.err
    assert "--socket PATH" in result.err
    assert 1 <= len(calls.read_text().splitlines()) <= 3


def test_wait_asked_while_rdmad_is_stopped_exits_3_at_once_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_systemctl(tmp_path, monkeypatch, STOPPED)
    started = time.monotonic()
    result = ctl("wait", "--within", "60", socket=str(tmp_path / "absent.sock"))
    assert result.code == exits.NOT_RUNNING, result
    assert time.monotonic() - started < 10, "waited for --within"
    assert "rdmad.service is stopped" in result.err
    assert "start it: systemctl start rdmad.service" in result.err


def test_no_systemctl_or_a_failing_one_is_doubt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unitstate, "SYSTEMCTL", str(tmp_path / "none"))
    assert unitstate.stopped_for_good("rdmad.service") is None
    script = tmp_path / "systemctl"
    script.write_text(f"#!/bin/sh\necho '{STOPPED}'\nexit 1\n")  # "Host is down"
    script.chmod(0o755)
    monkeypatch.setattr(unitstate, "SYSTEMCTL", str(script))
    assert unitstate.stopped_for_good("rdmad.service") is None


def test_wait_exits_3_when_rdmad_stays_down_past_within(api: ApiStub) -> None:
    api.fixture("GET /v1/status", "status-blocked.json")

    result = ctl_beside(
        api, stopping_after_the_first_answer(api), "wait", "--within", "1.5", "--json"
    )
    assert result.code == exits.NOT_RUNNING, result
    assert "answered earlier, then was down until --within ended" in result.err
    assert json.loads(result.out)["error"]["code"] == "not-running"
    assert 2 <= len(api.requests) <= 8  # asked again, not a spin (WAIT_RESTART)


def test_wait_asks_again_when_an_answer_is_late_and_exits_5_only_when_none_came(
    api: ApiStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after READY=1 the socket takes connections before the daemon can answer
    (its web library still importing): a request that times out is asked again while
    --within lasts; with no answer at all by then, exit 5 as any command."""
    monkeypatch.setattr(commands, "WAIT_STEP", 0.2)  # each request's bound: 0.2 + --timeout
    late = threading.Event()
    api.routes["GET /v1/status"] = Reply(200, b"{}", hold=late)

    def answer_after_two_requests() -> None:
        for _ in range(1000):
            if len(api.requests) >= 2:  # the second is held too: the third is answered
                api.fixture("GET /v1/status", "status-converged.json")
            if len(api.requests) >= 3:  # the client gave up on the held ones
                late.set()
                return
            threading.Event().wait(0.01)

    result = ctl_beside(
        api, answer_after_two_requests, "--timeout", "0.2", "wait", "--within", "20"
    )
    assert result.code == exits.OK, result
    assert len(api.requests) >= 2

    api.routes["GET /v1/status"] = Reply(200, b"{}", hold=threading.Event())
    result = ctl("--timeout", "0.2", "wait", "--within", "0.5", socket=api.socket)
    assert result.code == exits.NO_ANSWER, result
