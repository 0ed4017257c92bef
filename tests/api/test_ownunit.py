"""The systemd unit the daemon names in its status (`rdmad-ctl wait` asks systemd about
it when the daemon stops answering)."""

from __future__ import annotations

from pathlib import Path

from rdmad.api import documents as docs
from rdmad.api.ownunit import own_unit, unit_of
from rdmad.status import StatusSnapshot


def test_the_unit_is_the_service_of_the_cgroup_path() -> None:
    assert unit_of("0::/system.slice/rdmad.service\n") == "rdmad.service"
    # cgroup v1 (EL 8): the name=systemd hierarchy, whatever else is listed
    v1 = (
        "12:memory:/system.slice/rdmad.service\n"
        "3:cpu,cpuacct:/system.slice\n"
        "1:name=systemd:/system.slice/rdmad.service\n"
    )
    assert unit_of(v1) == "rdmad.service"
    # hybrid: both, the same unit
    assert unit_of("1:name=systemd:/system.slice/a.service\n0::/system.slice/a.service\n") == (
        "a.service"
    )


def test_no_service_is_none() -> None:
    assert unit_of("0::/user.slice/user-0.slice/session-3.scope\n") is None
    assert unit_of("0::/\n") is None  # a container's own root
    assert unit_of("5:devices:/system.slice/x.service\n") is None  # not the unit's hierarchy
    assert unit_of("") is None


def test_read_only_when_systemd_started_the_process(tmp_path: Path) -> None:
    cgroup = tmp_path / "cgroup"
    cgroup.write_text("0::/system.slice/rdmad.service\n")
    assert own_unit({"INVOCATION_ID": "96c6"}, str(cgroup)) == "rdmad.service"
    assert own_unit({}, str(cgroup)) is None  # a shell or a container, the same cgroup text
    assert own_unit({"INVOCATION_ID": "96c6"}, str(tmp_path / "none")) is None


def test_the_status_document_names_it() -> None:
    snap = StatusSnapshot(objects=(), passes=1)
    doc = docs.status_doc(snap, docs.DaemonFacts(7, 1.0, unit="rdmad.service"))
    assert doc["daemon"]["unit"] == "rdmad.service"
    assert docs.status_doc(snap, docs.DaemonFacts(7, 1.0))["daemon"]["unit"] is None
