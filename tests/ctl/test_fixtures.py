"""The fixture documents the rdmad-ctl tests are served follow docs/API.md: the keys
it lists, the states and events it names, and the per-VF / per-attribute shapes the
daemon's own model serialises (rdmad.model.status)."""

from __future__ import annotations

from typing import Any

import pytest

from rdmad.model import AttrStatus, ObjectState, VfStatus
from tests.ctl.conftest import fixture

STATES = {s.value for s in ObjectState}
DAEMON = {"pid", "ready", "dry_run", "start_kind", "boot_id", "started_at", "passes",
          "last_pass_at", "last_pass_seconds", "last_cause", "config_ok", "config_errors",
          "config_files", "notes"}  # fmt: skip
OBJECT = {"obj", "kind", "state", "reason", "last_error", "errno", "failures", "retry_at",
          "last_change", "desired", "observed", "attributes", "vfs"}  # fmt: skip
ATTR = set(AttrStatus("x", 1, 1, ObjectState.CONVERGED).to_json())
VF = set(VfStatus(0, None, None, None, ObjectState.CONVERGED).to_json())
EVENTS = {"applied", "failed", "recorded", "start", "config-reloaded", "config-invalid",
          "state-rebuilt", "recovered"}  # fmt: skip


def _attrs(attrs: list[dict[str, Any]]) -> None:
    for a in attrs:
        assert set(a) == ATTR and a["state"] in STATES, a


@pytest.mark.parametrize("case", ["converged", "blocked", "unsupported", "degraded"])
def test_status_fixture_follows_the_api(case: str) -> None:
    doc = fixture(f"status-{case}.json")
    assert set(doc) == {"api", "version", "summary", "converged", "daemon", "counts", "objects"}
    assert doc["api"] == 1 and isinstance(doc["converged"], bool)
    assert set(doc["daemon"]) == DAEMON
    assert set(doc["counts"]) == STATES
    for obj in doc["objects"]:
        assert set(obj) == OBJECT, obj["obj"]
        assert obj["kind"] in ("sriov", "rxe") and obj["state"] in STATES
        assert obj["last_change"] is None or set(obj["last_change"]) == {
            "at", "what", "reason", "cause"
        }  # fmt: skip
        _attrs(obj["attributes"])
        for vf in obj["vfs"]:
            assert set(vf) == VF and vf["state"] in STATES
            assert vf["usage"] in ("free", "in-use", "unknown")
            _attrs(vf["attributes"])
    counted = {s: sum(1 for o in doc["objects"] if o["state"] == s) for s in STATES}
    assert doc["counts"] == counted


def test_other_fixtures_follow_the_api() -> None:
    history = fixture("history.json")
    assert set(history) == {"api", "entries"}
    for e in history["entries"]:
        assert set(e) == {"at", "event", "obj", "what", "reason", "cause", "error", "errno"}
        assert e["event"] in EVENTS
    plan = fixture("plan.json")
    assert set(plan) == {"api", "source", "at", "cause", "dry_run", "actions", "objects"}
    for a in plan["actions"]:
        assert set(a) == {"obj", "kind", "describe", "reason", "changes_kernel"}
    for o in plan["objects"]:
        assert set(o) == {"obj", "state", "reason"} and o["state"] in STATES
    config = fixture("config.json")
    assert set(config) == {"api", "files", "ok", "errors", "config", "values"}
    for v in config["values"]:
        assert set(v) == {"key", "value", "file", "file_key"}
    assert set(fixture("snapshot.json")) == {"api", "toml", "config", "notes", "settings_unknown"}
