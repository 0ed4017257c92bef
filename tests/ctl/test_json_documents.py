"""One JSON schema per document, as docs/API.md shows it: each example marked
``<!-- document: NAME -->`` there has the keys (and its items the keys) of what the
commands print, from every command that prints that document."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest

from rdmad import config
from rdmad.api.documents import plan_doc
from rdmad.cli import main as rdmad_main
from rdmad.kernel.apply.oneshot import observe_host
from rdmad.model import PlanState, summarize
from rdmad.reconcile import declared_objects, plan
from rdmad.status import PlanReport
from tests.ctl.conftest import REPO, ApiStub, ctl, fixture
from tests.ctl.test_golden import _saved_state
from tests.support.fakesysfs import mlx5_node

API_MD = REPO / "docs/API.md"
NOT_DESCRIBED = "…"  # an example value starting so stands for what is not spelt out


def documented() -> dict[str, Any]:
    text = API_MD.read_text()
    blocks = re.findall(r"<!-- document: ([\w-]+) -->\n```json\n(.*?)\n```", text, re.S)
    return {name: json.loads(body) for name, body in blocks}


def same_shape(doc: Any, actual: Any, where: str = "") -> None:
    """The same keys at every level the example spells out (a list: its first item)."""
    if isinstance(doc, str) and doc.startswith(NOT_DESCRIBED):
        return
    if isinstance(doc, dict):
        assert isinstance(actual, dict), f"{where}: not an object: {actual!r}"
        assert set(actual) == set(doc), f"{where}: {sorted(actual)} != {sorted(doc)}"
        for key, value in doc.items():
            same_shape(value, actual[key], f"{where}.{key}")
    elif isinstance(doc, list) and doc and actual:
        assert isinstance(actual, list), where
        for item in actual:
            same_shape(doc[0], item, f"{where}[]")


def rdmad_json(*argv: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rdmad_main([*argv, "--json"])
    return json.loads(out.getvalue())


@pytest.fixture
def demo(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    mlx5_node(root)
    cfg = tmp_path / "rdmad.toml"
    cfg.write_text((REPO / "tests/fixtures/demo-node.toml").read_text())
    return root, cfg


def test_every_document_is_documented_once() -> None:
    names = re.findall(r"<!-- document: ([\w-]+) -->", API_MD.read_text())
    assert sorted(names) == sorted(set(names))
    assert set(names) == {
        "plan", "plan-local", "error", "status-down", "history-down", "check-config",
        "snapshot",
    }  # fmt: skip


def test_the_plan_is_one_document(demo: tuple[Path, Path], api: ApiStub) -> None:
    """GET /v1/plan (what rdmad-ctl plan and rdmad plan --daemon print as is) and
    rdmad plan's own: the same actions and objects."""
    docs = documented()
    root, cfg = demo
    desired = config.load(cfg).desired
    actions = plan(desired, observe_host(root), PlanState())
    report = PlanReport(
        1.0, "api", tuple(actions), tuple(summarize(declared_objects(desired), actions))
    )
    same_shape(docs["plan"], plan_doc(report), "GET /v1/plan")
    same_shape(docs["plan"], fixture("plan.json"), "rdmad-ctl's stand-in plan.json")
    local = rdmad_json("plan", "--root", str(root), "--config", str(cfg))
    same_shape(docs["plan-local"], local, "rdmad plan --json")
    extra = {"config", "root", "state", "notes"}
    assert set(docs["plan-local"]) == set(docs["plan"]) | extra
    assert docs["plan-local"]["actions"][0].keys() == docs["plan"]["actions"][0].keys()
    assert docs["plan-local"]["objects"][0].keys() == docs["plan"]["objects"][0].keys()


def test_the_error_object(tmp_path: Path, short_dir: Path) -> None:
    docs = documented()
    bad = tmp_path / "bad.toml"
    bad.write_text("[peermem]\nmode = 7\n")
    same_shape(docs["error"], rdmad_json("plan", "--config", str(bad)), "rdmad plan")
    checked = rdmad_json("check-config", "--config", str(bad))
    assert checked["valid"] is False
    same_shape(docs["error"]["error"], checked["error"], "rdmad check-config")
    # Without a config's errors, the same object less `errors`.
    plain = {k: v for k, v in docs["error"]["error"].items() if k != "errors"}
    absent = str(short_dir / "absent.sock")
    for doc in (
        rdmad_json("plan", "--root", str(tmp_path / "nonexistent")),
        json.loads(ctl("plan", "--json", socket=absent).out),
    ):
        same_shape({"error": plain}, doc)


def test_the_documents_of_a_daemon_that_is_down(short_dir: Path) -> None:
    docs = documented()
    _saved_state(short_dir)
    absent = str(short_dir / "absent.sock")
    status = ctl("status", "--json", socket=absent, state_dir=str(short_dir))
    same_shape(docs["status-down"], json.loads(status.out), "rdmad-ctl status --json")
    history = ctl("history", "--json", socket=absent, state_dir=str(short_dir))
    same_shape(docs["history-down"], json.loads(history.out), "rdmad-ctl history --json")


def test_check_config_and_snapshot(demo: tuple[Path, Path]) -> None:
    docs = documented()
    root, _ = demo
    good = rdmad_json("check-config", "--config", str(REPO / "etc/rdmad/rdmad.toml"))
    same_shape(docs["check-config"], good, "rdmad check-config --json")
    snap = rdmad_json("snapshot", "--root", str(root))
    same_shape(docs["snapshot"], snap, "rdmad snapshot --json")
    same_shape(docs["snapshot"], fixture("snapshot.json"), "rdmad-ctl's stand-in snapshot.json")
