"""A state file whose entries are odd (hand-edited, written by another version, bit rot):
each odd entry is dropped with one warning naming it, the rest is kept, and the daemon's
status reaches what the node really is. A state file is never needed to be correct."""

from __future__ import annotations

import asyncio
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmad.agent import Agent, AgentOptions
from rdmad.model import ObjectState
from rdmad.state import State, StateStore
from tests.agent.conftest import ConfigBox, FakeHost, Notes, Rig, RigFactory, desired
from tests.support.fakeclock import FakeClock


def _converged(rig: Rig) -> bool:
    snap = rig.agent.status.current
    return (
        snap.ready
        and snap.passes > 0
        and bool(snap.objects)
        and all(o.state is ObjectState.CONVERGED for o in snap.objects)
        and not any(n.startswith("internal error") for n in snap.notes)
    )


async def test_an_applied_entry_that_is_not_an_object_is_dropped_and_status_converges(
    rig: RigFactory, tmp_path: Path
) -> None:
    """The example of issue 42: every pass logged status.crashed, status stayed "starting"."""
    state_dir = tmp_path / "st"
    state_dir.mkdir()
    good = {"what": "add rxe0 on eth1", "at": 5.0, "reason": "declared", "cause": "boot"}
    (state_dir / "state.json").write_text(
        json.dumps(
            {
                "version": 1,
                "boot_id": "boot-1",
                "managed_rxe": ["rxe0", "rxe1"],
                "applied": {"rxe rxe0": "x", "rxe rxe1": good},
            }
        )
    )
    r = rig(desired(("rxe0", "eth0"), ("rxe1", "eth1")), state_dir=state_dir)
    r.host.links.update({"rxe0": "eth0", "rxe1": "eth1"})  # a restart: nothing to do
    with structlog.testing.capture_logs() as logs:
        await r.start()
        await r.idle()
    assert _converged(r), r.agent.status.current
    assert not [e for e in logs if e["event"] == "status.crashed"]
    warned = [e for e in logs if e["event"] == "state.entries-dropped"]
    assert len(warned) == 1, warned
    assert warned[0]["dropped"] == ['applied["rxe rxe0"]: not an object: "x"'], warned
    # What was good is kept: the restart still owns rxe1, and its last change is shown.
    rxe1 = next(o for o in r.agent.status.current.objects if o.obj == "rxe rxe1")
    assert rxe1.last_change is not None and rxe1.last_change["what"] == "add rxe0 on eth1"
    assert r.agent.state.managed_rxe == {"rxe0", "rxe1"}
    # Rebuilt: the file saved after the first pass holds nothing odd any more.
    saved = json.loads((state_dir / "state.json").read_text())
    assert "rxe rxe0" not in saved["applied"] and saved["applied"]["rxe rxe1"] == good
    again, problem = StateStore(state_dir).load()
    assert problem is None and again is not None and again.dropped == []
    await r.stop()


def test_each_kind_of_odd_entry_is_named_and_the_good_ones_kept() -> None:
    doc = {
        "version": 1,
        "boot_id": 7,
        "started_at": "yesterday",
        "managed_rxe": ["rxe0", 3],
        "applied": {"a": {"what": "w", "at": 1.0}, "b": {"what": "w", "at": float("nan")}},
        "last_errors": {"a": {"error": "e", "at": 2.0, "failures": 2, "errno": 5}, "b": []},
        "history": [
            {"at": 1.0, "event": "applied", "obj": "a"},
            {"at": 10**400, "event": "applied"},
            {"event": "start"},
            "x",
        ],
    }
    state = State.from_json(doc)
    assert state.boot_id == "" and state.started_at == 0.0
    assert state.managed_rxe == {"rxe0"}
    assert list(state.applied) == ["a"] and state.applied["a"]["reason"] == ""
    assert state.last_errors == {"a": {"error": "e", "at": 2.0, "failures": 2, "errno": 5}}
    assert [h.obj for h in state.history] == ["a"]
    assert state.dropped == [
        "boot_id: not a string: 7",
        'started_at: not a number: "yesterday"',
        "managed_rxe[1]: not a name: 3",
        'applied["b"].at: not a finite number: NaN',
        'last_errors["b"]: not an object: []',
        "history[1].at: not a finite number: 1000000000000000000000000000000…",
        "history[2].at: missing",
        'history[3]: not an object: "x"',
    ]


# --- any JSON at all --------------------------------------------------------------------------

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**400)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
OBJ = st.sampled_from(["rxe rxe0", "rxe rxe1", ""]) | st.text(max_size=6)
APPLIED = st.fixed_dictionaries({}, optional={k: JSON for k in ("what", "at", "reason", "cause")})
ERROR = st.fixed_dictionaries({}, optional={k: JSON for k in ("error", "at", "failures", "errno")})
ENTRY = st.fixed_dictionaries(
    {},
    optional={
        k: JSON | st.text(max_size=5)
        for k in ("at", "event", "obj", "what", "reason", "cause", "error", "errno", "kind")
    },
)
DOCS = st.fixed_dictionaries(
    {"version": st.just(1)},
    optional={
        "boot_id": st.just("boot-1") | JSON,
        "started_at": JSON,
        "managed_rxe": st.lists(st.sampled_from(["rxe0", "rxe1"]) | JSON, max_size=4) | JSON,
        "applied": st.dictionaries(OBJ, APPLIED | JSON, max_size=4) | JSON,
        "last_errors": st.dictionaries(OBJ, ERROR | JSON, max_size=4) | JSON,
        "history": st.lists(ENTRY | JSON, max_size=5) | JSON,
    },
)


async def _run_agent(state_dir: Path) -> Rig:
    host, clock = FakeHost(), FakeClock()
    cfg, notes = ConfigBox(desired(("rxe0", "eth0"), ("rxe1", "eth1"))), Notes()
    agent = Agent(
        host,
        cfg,
        clock=clock,
        notifier=notes,
        state_store=StateStore(state_dir),
        boot_id="boot-1",
        options=AgentOptions(backoff_jitter=0.0, drift_jitter=0.0),
        rng=lambda: 0.5,
    )
    r = Rig(agent, host, clock, cfg, notes)
    await r.start()
    await r.idle()
    await r.stop()
    return r


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(DOCS)
def test_any_state_document_leaves_status_to_the_node(doc: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as d:
        state_dir = Path(d)
        (state_dir / "state.json").write_text(json.dumps(doc))
        with structlog.testing.capture_logs() as logs:
            r = asyncio.run(_run_agent(state_dir))
        assert _converged(r), (doc, r.agent.status.current)
        assert not [e for e in logs if e["event"].endswith("crashed")], logs
        assert len([e for e in logs if e["event"] == "state.entries-dropped"]) <= 1
        # The saved state is whole again: read back, nothing is dropped.
        again, problem = StateStore(state_dir).load()
        assert problem is None and again is not None and again.dropped == [], (doc, again)
        for entry in again.applied.values():
            assert isinstance(entry["at"], float) and math.isfinite(entry["at"])
