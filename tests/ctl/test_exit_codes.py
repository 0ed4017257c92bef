"""One table of exit codes for rdmad and rdmad-ctl (rdmad/exits.py), checked against
both tools: each code the table gives a tool is what the tool returns in that case; with
--json a failure puts one JSON error object on stdout naming the same code; the table in
--help, the man pages' EXIT STATUS and README.md is this one."""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rdmad import config, exits, manpages
from rdmad.cli import main as rdmad_main
from rdmad.cli import parser as rdmad_parser
from rdmad.ctl.args import parser as ctl_parser
from tests.ctl.conftest import REPO, ApiStub, Reply, ctl, fixture

GOOD_CONFIG = str(REPO / "etc/rdmad/rdmad.toml")


def bad_config(tmp: Path) -> str:
    path = tmp / "bad.toml"
    path.write_text("[peermem]\nmode = 7\n")
    return str(path)


# (case, how to set the stub up, argv with {sock} and {tmp}); the code is in each table.
Setup = Callable[[ApiStub, Path], Any]


def _none(api: ApiStub, tmp: Path) -> None:
    return None


def _plan(api: ApiStub, tmp: Path) -> None:
    api.fixture("GET /v1/plan", "plan.json")  # an object stays blocked


def _plan_clear(api: ApiStub, tmp: Path) -> None:
    doc = fixture("plan.json")
    doc["objects"] = [o for o in doc["objects"] if o["state"] != "blocked"]
    api.json("GET /v1/plan", doc)


def _forbidden(api: ApiStub, tmp: Path) -> None:
    for route in ("GET /v1/plan", "GET /v1/status"):
        api.error(route, 403, "forbidden", "uid 1000 is not in group rdmad")


def _stuck(api: ApiStub, tmp: Path) -> None:
    api.routes["GET /v1/status"] = Reply(200, b"{}", hold=threading.Event())


def _status(case: str) -> Setup:
    return lambda api, tmp: api.fixture("GET /v1/status", f"status-{case}.json")


def _config_invalid(api: ApiStub, tmp: Path) -> None:
    doc = fixture("config.json")
    api.json("GET /v1/config", {**doc, "ok": False, "errors": ["rdmad.toml: x: bad"]})


RDMAD: list[tuple[int, Setup, list[str]]] = [
    (exits.OK, _none, ["check-config", "--config", GOOD_CONFIG]),
    (exits.OK, _plan_clear, ["plan", "--daemon"]),
    (exits.FAIL, _plan, ["plan", "--daemon"]),
    (exits.USAGE, _none, ["plan", "--root", "{tmp}/nonexistent"]),
    (exits.USAGE, _none, ["snapshot", "--root", "{tmp}/nonexistent"]),
    (exits.USAGE, _none, ["plan", "--bogus"]),
    (exits.NOT_RUNNING, _none, ["plan", "--daemon"]),  # the socket is absent: see below
    (exits.DENIED, _forbidden, ["plan", "--daemon"]),
    (exits.CONFIG_INVALID, _none, ["check-config", "--config", "{bad}"]),
    (exits.CONFIG_INVALID, _none, ["plan", "--config", "{bad}"]),
]

CTL: list[tuple[int, Setup, list[str]]] = [
    (exits.OK, _status("converged"), ["status"]),
    (exits.OK, _plan_clear, ["plan"]),
    (exits.FAIL, _status("blocked"), ["status"]),
    (exits.FAIL, _plan, ["plan"]),
    (exits.USAGE, _none, ["status", "--bogus"]),
    (exits.USAGE, _none, ["doctor", "--root", "{tmp}/nonexistent"]),
    (exits.NOT_RUNNING, _none, ["plan"]),
    (exits.DENIED, _forbidden, ["status"]),
    (exits.NO_ANSWER, _stuck, ["status", "--timeout", "0.2"]),
    (exits.CONFIG_INVALID, _config_invalid, ["config"]),
]

# A code the table names and a tool cannot return: rdmad asks the daemon only for
# `plan --daemon`, with a 15 s wait (NO_ANSWER there is rdmad-ctl's client error, the same
# class: covered through rdmad-ctl); INTERRUPTED needs a Ctrl-C (tests/ctl/test_watch.py).
UNTESTED = {"rdmad": {exits.NO_ANSWER, exits.INTERRUPTED}, "rdmad-ctl": {exits.INTERRUPTED}}


def _argv(argv: list[str], tmp: Path) -> list[str]:
    return [a.format(tmp=tmp, bad=bad_config(tmp)) for a in argv]


def _socket(api: ApiStub, code: int) -> str:
    return api.socket + ".absent" if code == exits.NOT_RUNNING else api.socket


def run_rdmad(argv: list[str], socket: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setenv("RDMAD_SOCKET", socket)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = rdmad_main(argv)
        except SystemExit as exc:  # argparse's usage error
            code = int(exc.code or 0)
    return code, out.getvalue()


def run_ctl(argv: list[str], socket: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        try:
            result = ctl(*argv, socket=socket)
            return result.code, result.out
        except SystemExit as exc:
            return int(exc.code or 0), out.getvalue()


def check_json(code: int, out: str) -> None:
    """--json: one JSON document on stdout; a failure's names its code."""
    doc = json.loads(out)
    assert isinstance(doc, dict)
    if code in (exits.OK, exits.FAIL) and "error" not in doc:
        return  # an answer (not converged, a plan that stays blocked), not a failure
    assert doc["error"]["exit"] == code and doc["error"]["code"] == exits.NAMES[code], doc
    assert isinstance(doc["error"]["message"], str) and doc["error"]["message"]


@pytest.fixture
def no_default_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "etc"
    empty.mkdir()
    monkeypatch.setattr(config, "DEFAULT_DIR", empty)


@pytest.mark.usefixtures("no_default_config")
@pytest.mark.parametrize(("code", "setup", "argv"), RDMAD)
def test_rdmad_exits_as_the_table_says(
    api: ApiStub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    code: int,
    setup: Setup,
    argv: list[str],
) -> None:
    setup(api, tmp_path)
    argv = _argv(argv, tmp_path)
    socket = _socket(api, code)
    assert run_rdmad(argv, socket, monkeypatch)[0] == code
    got, out = run_rdmad([*argv, "--json"], socket, monkeypatch)
    assert got == code
    check_json(code, out)


@pytest.mark.parametrize(("code", "setup", "argv"), CTL)
def test_rdmad_ctl_exits_as_the_table_says(
    api: ApiStub, tmp_path: Path, code: int, setup: Setup, argv: list[str]
) -> None:
    setup(api, tmp_path)
    argv = _argv(argv, tmp_path)
    socket = _socket(api, code)
    assert run_ctl(argv, socket)[0] == code
    got, out = run_ctl([*argv, "--json"], socket)
    assert got == code
    check_json(code, out)


def test_every_code_of_the_table_is_checked_against_each_tool() -> None:
    table = set(exits.NAMES)
    assert {c for c, _, _ in RDMAD} | UNTESTED["rdmad"] == table
    assert {c for c, _, _ in CTL} | UNTESTED["rdmad-ctl"] == table


def _help(parser: Callable[[], Any]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    return " ".join(out.getvalue().split())


def test_both_tools_help_shows_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    for parser in (rdmad_parser, ctl_parser):
        text = _help(parser)
        assert "exit codes (rdmad and rdmad-ctl):" in text
        for code, _, meaning in exits.TABLE:
            assert f"{code} {' '.join(meaning.replace('`', '').split())}" in text


def test_both_man_pages_have_the_table_as_exit_status(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    pages = manpages.pages("9.9.9")
    for name in ("man8/rdmad.8", "man8/rdmad-ctl.8"):
        troff = pages[name]
        section = troff.split(".SH EXIT STATUS\n", 1)[1].split("\n.SH ", 1)[0]
        for code, label, meaning in exits.TABLE:
            assert f".TP\n{code} ({manpages.troff(label)})\n{manpages.troff(meaning)}" in section
        # ...and once: the epilog's copy points there instead
        assert troff.count(manpages.troff(exits.TABLE[-1][2])) == 1, name
        assert "exit codes (rdmad and rdmad\\-ctl): see EXIT STATUS" in troff


def test_readme_has_the_table() -> None:
    readme = (REPO / "README.md").read_text()
    start = readme.index("| exit | JSON `error.code` | meaning |")
    assert readme[start:].startswith(exits.markdown_table())
    # The API docs (shipped, unlike this README) point at the man pages, not a copy.
    assert "EXIT STATUS in rdmad(8) and\nrdmad-ctl(8)" in (REPO / "docs/API.md").read_text()
    assert re.search(r"^### Exit codes$", readme, re.M)
