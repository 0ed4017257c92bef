"""plan() for [peermem]: which actions and which status, mode by mode (table tests)."""

from __future__ import annotations

import pytest

from rdmad.model import (
    Blocked,
    Degraded,
    Desired,
    LoadModule,
    ModulesObserved,
    Note,
    ObjectState,
    Observed,
    PlanState,
    summarize,
)
from rdmad.model.validation import validate
from rdmad.peermem.choice import Held
from rdmad.peermem.facts import ModuleFile, PeermemFacts
from rdmad.peermem.findings import diagnose
from rdmad.reconcile import declared_objects, plan
from rdmad.reconcile.detail import describe

PEERMEM = ModuleFile("nvidia_peermem", "updates/dkms/nvidia-peermem.ko", True, True, 100)
BASE = PeermemFacts(release="6.1.0-26-amd64", files=(PEERMEM,), peer_api=True)
BOTH = frozenset({"nvidia", "ib_core", "mlx5_ib"})


def facts(loaded: frozenset[str] = BOTH, **kw: object) -> PeermemFacts:
    d = {k: getattr(BASE, k) for k in BASE.__slots__}  # type: ignore[attr-defined]
    d.update(kw, loaded=loaded)
    return PeermemFacts(**d)  # type: ignore[arg-type]


def observed(f: PeermemFacts) -> Observed:
    return Observed(
        modules=ModulesObserved(
            f.loaded, support="disabled" if f.loading_disabled else "loadable", peermem=f
        )
    )


def desired(mode: str) -> Desired:
    return validate(Desired, {"peermem": {"mode": mode}})


def kinds(mode: str, f: PeermemFacts, state: PlanState | None = None) -> list[str]:
    return [a.kind for a in plan(desired(mode), observed(f), state or PlanState())]


@pytest.mark.parametrize(
    ("mode", "f", "expected", "status"),
    [
        ("off", facts(), [], None),
        ("auto", facts(frozenset({"ib_core"})), [], None),
        ("auto", facts(frozenset({"nvidia"})), [], None),
        ("auto", facts(), ["load-module"], ObjectState.PENDING),
        ("require", facts(), ["load-module"], ObjectState.PENDING),
        ("auto", facts(BOTH | {"nvidia_peermem"}), ["note"], ObjectState.CONVERGED),
        ("require", facts(BOTH | {"nvidia_peermem"}), ["note"], ObjectState.CONVERGED),
        ("require", facts(frozenset({"ib_core"})), ["degraded"], ObjectState.DEGRADED),
        ("auto", facts(loading_disabled=True), ["blocked"], ObjectState.BLOCKED),
        ("require", facts(loading_disabled=True), ["degraded"], ObjectState.DEGRADED),
        ("auto", facts(files=()), ["blocked"], ObjectState.BLOCKED),
        ("auto", facts(peer_api=False), ["blocked"], ObjectState.BLOCKED),
        # No module, but DMA-BUF works: nothing is wrong in auto mode.
        (
            "auto",
            facts(files=(), dmabuf_symbol=True, open_gpu_modules=True),
            ["note"],
            ObjectState.CONVERGED,
        ),
    ],
)
def test_plan_table(
    mode: str, f: PeermemFacts, expected: list[str], status: ObjectState | None
) -> None:
    actions = plan(desired(mode), observed(f), PlanState())
    assert [a.kind for a in actions] == expected
    objs = declared_objects(desired(mode)) or sorted({a.obj for a in actions})
    states = summarize(objs, actions)
    if status is None:
        assert states == [] or states[0].state is ObjectState.CONVERGED
    else:
        assert [s.state for s in states] == [status]
        assert states[0].obj == "peermem"


def test_load_names_the_module_as_modprobe_does() -> None:
    [load] = plan(desired("auto"), observed(facts()), PlanState())
    assert isinstance(load, LoadModule)
    assert load.module == "nvidia-peermem"
    assert "nvidia and ib_core are loaded" in load.reason


def test_never_unloads() -> None:
    for mode in ("off", "auto", "require"):
        f = facts(frozenset({"nvidia_peermem"}))  # GPU driver gone, peermem still there
        assert all(a.kind != "unload-module" for a in plan(desired(mode), observed(f), PlanState()))


def test_require_is_always_listed_auto_only_when_it_matters() -> None:
    assert declared_objects(desired("require")) == ["peermem"]
    assert declared_objects(desired("auto")) == []


def test_a_held_failure_is_not_retried_until_the_facts_change() -> None:
    f = facts()
    finding = diagnose(
        "nvidia-peermem",
        "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument",
        ["nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client"],
    )
    state = PlanState(peermem_held=Held("nvidia_peermem", finding, f.fingerprint()))
    [auto] = plan(desired("auto"), observed(f), state)
    assert isinstance(auto, Blocked) and "symbol-version-mismatch" in auto.reason
    [req] = plan(desired("require"), observed(f), state)
    assert isinstance(req, Degraded)
    # The RDMA stack was restarted (mlx5_ib gone and back is another loaded set): retry.
    changed = facts(BOTH - {"mlx5_ib"})
    assert kinds("auto", changed, state) == ["load-module"]


def test_status_detail_names_the_module_and_the_findings() -> None:
    f = facts(files=(), dmabuf_symbol=True, open_gpu_modules=True)
    actions = plan(desired("auto"), observed(f), PlanState())
    [note] = actions
    assert isinstance(note, Note)
    detail = describe(desired("auto"), observed(f), actions)["peermem"]
    assert detail.kind == "peermem"
    assert detail.observed["loaded"] is False
    assert [x["id"] for x in detail.observed["findings"]] == [
        "module-not-found",
        "dmabuf-available",
    ]
    [attr] = detail.attributes
    assert attr.state is ObjectState.CONVERGED


def test_status_detail_when_loaded() -> None:
    f = facts(BOTH | {"nvidia_peermem"})
    actions = plan(desired("require"), observed(f), PlanState())
    detail = describe(desired("require"), observed(f), actions)["peermem"]
    assert detail.observed["module"] == "nvidia-peermem" and detail.observed["loaded"]
    assert detail.attributes[0].state is ObjectState.CONVERGED
