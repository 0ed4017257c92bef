"""One truth about "converged": for every object state (and for a node whose passes
fail, one starting, one with an invalid config) rdmad-ctl's headline and exit code,
/v1/status, sd_notify's StatusText and the ``rdmad_converged`` gauge say the same
thing, and it is what README's exit table says. The alert that reads the gauge is
checked against the same cases with promtool (tests/deploy/test_prometheus.py)."""

from __future__ import annotations

import argparse
import io
import json
from dataclasses import dataclass
from typing import Any

import pytest

from rdmad import exits
from rdmad.api import documents as docs
from rdmad.api.metrics import Metrics
from rdmad.ctl import commands
from rdmad.model import CONVERGED_STATES, ObjectState
from rdmad.status import ObjectReport, StatusSnapshot, StatusStore
from tests.api.metricsutil import parse, value

S = ObjectState
NOW = 1795000200.0


@dataclass(frozen=True)
class Case:
    name: str
    snap: StatusSnapshot
    converged: bool  # what README's exit table says: exit 0 (True) or 1 (False)
    word: str  # the headline's verdict word


def _node(state: ObjectState, **kw: Any) -> StatusSnapshot:
    objects = (
        ObjectReport("rxe rxe0", S.CONVERGED),
        ObjectReport("sriov pci=0000:00:03.0", state, f"why {state.value}"),
    )
    return StatusSnapshot(objects=objects, passes=kw.pop("passes", 3), ready=True, **kw)


# README: exit 0 "converged ... attributes a driver refuses (unsupported-by-driver) are
# listed but count as converged"; exit 1 "not converged (pending, blocked, degraded,
# drift on an in-use VF)".
README_CONVERGED = {
    S.CONVERGED: True,
    S.UNSUPPORTED: True,
    S.PENDING: False,
    S.BLOCKED: False,
    S.DEGRADED: False,
    S.DRIFT_IN_USE: False,
}

CASES = [
    Case(
        f"object-{state.value}",
        _node(state),
        README_CONVERGED[state],
        "converged"
        if README_CONVERGED[state]
        else ("DEGRADED" if state is S.DEGRADED else "NOT converged"),
    )
    for state in ObjectState
] + [
    Case(
        "passes-failing",
        _node(
            S.CONVERGED,
            last_pass_ok=False,
            pass_error="observing the kernel failed: [Errno 24] Too many open files",
        ),
        False,
        "DEGRADED",
    ),
    Case("starting", _node(S.CONVERGED, passes=0), False, "NOT converged yet"),
    Case(
        "config-invalid", _node(S.CONVERGED, config_errors=("a.toml: x",)), False, "NOT converged"
    ),
]


def test_every_object_state_is_covered() -> None:
    # A new ObjectState must be given a README meaning here (and a decision in the model).
    assert set(README_CONVERGED) == set(ObjectState)
    assert {s for s, ok in README_CONVERGED.items() if ok} == CONVERGED_STATES


class _Client:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.timeout = 5.0

    def get(self, path: str, query: object = None) -> Any:
        assert path == "/v1/status"
        return self.doc


def ctl_status(doc: dict[str, Any]) -> tuple[int, list[str]]:
    """`rdmad-ctl status` on the document as it crosses the socket (JSON)."""
    out = io.StringIO()
    ctx = commands.Ctx(out, io.StringIO(), now=lambda: NOW)
    args = argparse.Namespace(json=False, verbose=False, socket="/x", state_dir="/x")
    code = commands.status(args, ctx, _Client(json.loads(docs.dumps(doc))))  # type: ignore[arg-type]
    return code, out.getvalue().splitlines()


def rdmad_converged(snap: StatusSnapshot) -> float | None:
    store = StatusStore()
    store.publish(snap)
    return value(parse(Metrics(store).render()), "rdmad_converged")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cli_api_status_text_and_metrics_agree(case: Case) -> None:
    snap = case.snap
    doc = docs.status_doc(snap, docs.DaemonFacts(812, NOW - 60))

    code, lines = ctl_status(doc)
    headline = next(line for line in lines if line.startswith("Node "))
    summary = snap.summary()
    verdicts = {
        "README": case.converged,
        "/v1/status converged": doc["converged"],
        "/v1/status verdict": doc["verdict"]["state"] == "converged",
        "events stream": docs.status_event(snap)["converged"],
        "rdmad-ctl exit": code == exits.OK,
        "rdmad-ctl headline": headline.startswith("Node converged:"),
        "StatusText": not summary.startswith(("NOT converged", "DEGRADED", "starting")),
        "rdmad_converged": rdmad_converged(snap) == 1.0,
    }
    assert set(verdicts.values()) == {case.converged}, verdicts
    assert headline.startswith(f"Node {case.word}:"), headline
    if not case.converged:
        assert doc["verdict"]["reason"], doc["verdict"]


def test_drift_on_an_in_use_vf_is_not_converged_anywhere() -> None:
    """The operator's report: "Node converged: 2 objects, 1 converged, 1
    drift-on-in-use-vf" and exit 0; README says exit 1."""
    snap = _node(S.DRIFT_IN_USE)
    code, lines = ctl_status(docs.status_doc(snap, docs.DaemonFacts(812, NOW)))
    assert code == exits.FAIL
    assert "Node NOT converged: 2 objects, 1 converged, 1 drift-on-in-use-vf" in lines
    assert snap.summary().startswith("NOT converged: 2 object(s), 1 converged, 1 drift-on")


def test_failing_passes_name_the_error_everywhere() -> None:
    snap = next(c.snap for c in CASES if c.name == "passes-failing")
    doc = docs.status_doc(snap, docs.DaemonFacts(812, NOW))
    _, lines = ctl_status(doc)
    assert doc["verdict"]["state"] == "degraded"
    assert "Too many open files" in doc["verdict"]["reason"]
    assert doc["daemon"]["pass_error"] == snap.pass_error
    assert any("passes fail: observing the kernel failed" in line for line in lines), lines
    assert snap.summary().startswith("DEGRADED: passes fail: observing the kernel failed")
    store = StatusStore()
    store.publish(snap)
    assert value(parse(Metrics(store).render()), "rdmad_passes_failing") == 1.0
