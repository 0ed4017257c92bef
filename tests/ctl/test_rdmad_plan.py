"""`rdmad plan` previews the config on disk (the question an operator asks after an
edit), also while the daemon runs, and says so; `rdmad plan --daemon` prints the running
daemon's plan (GET /v1/plan), from the config it loaded, in the formats it always had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rdmad import config
from rdmad.cli import main
from rdmad.ctl.render.plan import plan_body
from tests.ctl.conftest import ApiStub, Reply


@pytest.fixture
def no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty default config dir: a local plan of this host declares nothing."""
    monkeypatch.setattr(config, "DEFAULT_DIR", tmp_path)
    return tmp_path


def test_the_daemons_plan_on_request(
    api: ApiStub,
    no_config: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = api.fixture("GET /v1/plan", "plan.json")
    monkeypatch.setenv("RDMAD_SOCKET", api.socket)
    assert main(["plan", "--daemon"]) == 1  # its plan leaves an object blocked
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"The running rdmad's plan, from the config it loaded ({api.socket}, "
        "made 2026-11-18 11:09:59)"
    )
    rows = [(o["obj"], o["state"], o["reason"]) for o in doc["objects"]]
    assert out[3:] == plan_body(rows, doc["actions"])
    assert "1. [rxe rxe1] rdma link add rxe1 type rxe netdev eth1" in "\n".join(out)
    assert api.requests == [("GET", "/v1/plan")]


def test_one_plan_document_from_the_daemon_and_from_here(
    api: ApiStub,
    no_config: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`rdmad plan --daemon --json` is GET /v1/plan's document as is (and so
    `rdmad-ctl plan --json`); `rdmad plan --json` has the same keys and words
    (obj/describe/reason), plus what it planned from."""
    doc = api.fixture("GET /v1/plan", "plan.json")
    monkeypatch.setenv("RDMAD_SOCKET", api.socket)
    assert main(["plan", "--json", "--daemon"]) == 1
    assert json.loads(capsys.readouterr().out) == doc
    (no_config / "rdmad.toml").write_text('[[rxe]]\nname = "rxe9"\nnetdev = { name = "nic9" }\n')
    assert main(["plan", "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert local["source"] == "local" and local["config"] == {
        "files": [str(no_config / "rdmad.toml")]
    }
    assert set(local) == set(doc) | {"config", "root", "state", "notes"}
    assert local["objects"][0].keys() == doc["objects"][0].keys()
    assert local["objects"][0]["obj"] == "rxe rxe9" and local["objects"][0]["state"] == "pending"


def test_the_plan_previews_the_config_on_disk_while_the_daemon_runs(
    api: ApiStub,
    no_config: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The operator edited the file; the daemon still runs the old one: `rdmad plan`
    answers "what will this edit do?", naming the files it planned from."""
    api.fixture("GET /v1/plan", "plan.json")  # the daemon's: "Nothing to do" for its config
    monkeypatch.setenv("RDMAD_SOCKET", api.socket)
    # A netdev that is not there: pending on any host (not blocked), so exit 0.
    (no_config / "rdmad.toml").write_text('[[rxe]]\nname = "rxe9"\nnetdev = { name = "nic9" }\n')
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert f"planned from the config on disk: {no_config / 'rdmad.toml'}" in out
    assert "rxe9" in out and api.requests == []


def test_daemon_takes_no_other_view(
    api: ApiStub, no_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--daemon", "--root", "/"]) == 2
    assert "--daemon prints the daemon's own plan" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--local", "--config", "--root", "--state"])
def test_another_view_is_computed_here(
    api: ApiStub,
    no_config: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    flag: str,
) -> None:
    api.fixture("GET /v1/plan", "plan.json")
    monkeypatch.setenv("RDMAD_SOCKET", api.socket)
    value = {"--local": [], "--config": [str(no_config)], "--root": ["/"],
             "--state": [str(no_config / "state.json")]}[flag]  # fmt: skip
    assert main(["plan", flag, *value]) == 0
    assert capsys.readouterr().out.startswith("Observed this host")
    assert api.requests == []


def test_no_daemon_plans_here_and_asking_it_fails_saying_why(
    short_dir: Path,
    no_config: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("RDMAD_SOCKET", str(short_dir / "absent.sock"))
    assert main(["plan"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("Observed this host")
    assert "Nothing to do" in captured.out and captured.err == ""
    assert main(["plan", "--daemon"]) == 3  # rdmad-ctl's code for it
    assert "rdmad is not running" in capsys.readouterr().err
    assert main(["plan", "--daemon", "--json"]) == 3
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["code"], error["exit"]) == ("not-running", 3)
    assert error["message"].startswith("rdmad is not running (no socket at ")


def test_daemon_that_cannot_answer_is_named(
    api: ApiStub,
    no_config: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api.routes["GET /v1/plan"] = Reply(
        503, b'{"error": {"status": 503, "code": "unavailable", "message": "a pass is stuck"}}'
    )
    monkeypatch.setenv("RDMAD_SOCKET", api.socket)
    assert main(["plan", "--daemon"]) == 1
    captured = capsys.readouterr()
    assert "no plan from the daemon" in captured.err and "a pass is stuck" in captured.err
    assert captured.out == ""
    assert main(["plan", "--daemon", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "failed"
