"""The JSON documents, built from snapshots directly (no socket)."""

from __future__ import annotations

import json

import pytest

from rdmad.api import documents as docs
from rdmad.model import AttrStatus, ObjectDetail, ObjectState, VfStatus
from rdmad.status import ObjectReport, StatusSnapshot

S = ObjectState


def snap(*states: ObjectState, passes: int = 3, errors: tuple[str, ...] = ()) -> StatusSnapshot:
    objects = tuple(ObjectReport(f"rxe r{i}", s) for i, s in enumerate(states))
    return StatusSnapshot(objects=objects, passes=passes, config_errors=errors)


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        (snap(S.CONVERGED, S.UNSUPPORTED), True),  # a refused attribute counts as converged
        (snap(S.CONVERGED, S.DRIFT_IN_USE), False),  # a VF in use differs: README's exit 1
        (snap(), True),  # nothing declared, a pass ran
        (snap(S.CONVERGED, S.BLOCKED), False),
        (snap(S.PENDING), False),
        (snap(S.DEGRADED), False),
        (snap(S.CONVERGED, passes=0), False),  # no pass yet
        (snap(S.CONVERGED, errors=("x.toml: bad",)), False),  # config invalid
    ],
)
def test_converged_rule(snapshot: StatusSnapshot, expected: bool) -> None:
    assert docs.converged(snapshot) is expected


def test_object_without_detail_has_empty_shapes() -> None:
    doc = docs.object_doc(ObjectReport("sriov pci=0000:3b:00.0", S.PENDING, "numvfs 0 -> 4"))
    assert doc["kind"] == "sriov" and doc["reason"] == "numvfs 0 -> 4"
    assert (doc["desired"], doc["observed"], doc["attributes"], doc["vfs"]) == ({}, {}, [], [])


def test_object_with_detail_per_vf_and_attribute() -> None:
    vf = VfStatus(
        3, "0000:00:04.3", None, "vfio-pci", S.BLOCKED, "in use", "in-use",
        ("pid 1234 (qemu-system-x86) holds /dev/vfio/42",),
        (AttrStatus("mac", "02:00:00:00:00:03", "02:00:00:00:00:03", S.CONVERGED),),
    )  # fmt: skip
    detail = ObjectDetail(
        "sriov",
        {"pf": "pci=0000:00:03.0", "numvfs": 2},
        {"numvfs": 4},
        (AttrStatus("numvfs", 2, 4, S.BLOCKED, "VF 3 in use"),),
        (vf,),
    )
    report = ObjectReport("sriov pci=0000:00:03.0", S.BLOCKED, "VF 3 in use", detail=detail)
    doc = docs.status_doc(StatusSnapshot(objects=(report,), passes=1), docs.DaemonFacts(7, 1.0))
    [o] = doc["objects"]
    assert o["desired"] == {"pf": "pci=0000:00:03.0", "numvfs": 2}
    assert o["attributes"] == [
        {"name": "numvfs", "desired": 2, "observed": 4, "state": "blocked", "reason": "VF 3 in use"}
    ]
    assert o["vfs"][0]["holders"] == ["pid 1234 (qemu-system-x86) holds /dev/vfio/42"]
    assert o["vfs"][0]["attributes"][0]["state"] == "converged"
    assert doc["counts"]["blocked"] == 1 and doc["converged"] is False
    assert doc["daemon"]["pid"] == 7


def test_renderer_bytes_are_the_status_document_and_reuse_unchanged_objects() -> None:
    detail = ObjectDetail("rxe", {"name": "r0"}, {"name": "r0"})
    calls: list[object] = []

    def dumps(doc: object) -> str:
        calls.append(doc)
        return json.dumps(doc)

    renderer = docs.StatusRenderer(dumps)
    facts = docs.DaemonFacts(7, 1.0)
    first = StatusSnapshot(
        objects=(
            ObjectReport("rxe r0", S.CONVERGED, detail=detail),
            ObjectReport("rxe r1", S.PENDING),
        ),
        passes=1,
    )
    assert json.loads(renderer.render(first, facts)) == docs.status_doc(first, facts)
    assert len(calls) == 3  # two objects and the head

    # The next pass: r0 unchanged (same detail), r1 now converged.
    second = StatusSnapshot(
        objects=(
            ObjectReport("rxe r0", S.CONVERGED, detail=detail),
            ObjectReport("rxe r1", S.CONVERGED),
        ),
        passes=2,
    )
    calls.clear()
    assert json.loads(renderer.render(second, facts)) == docs.status_doc(second, facts)
    assert [c.get("obj") for c in calls if isinstance(c, dict)] == ["rxe r1", None]
    # Nothing declared any more: an empty list, still valid JSON.
    empty = StatusSnapshot(passes=3)
    assert json.loads(renderer.render(empty, facts)) == docs.status_doc(empty, facts)
