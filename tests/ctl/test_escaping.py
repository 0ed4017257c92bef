"""rdmad-ctl prints no control byte it did not write itself: a holder's comm, a
netdev name or a config value with ESC, C1 or newlines in it comes out escaped
(rdmad.text), in every table and line; ``--json`` keeps the exact string.
The daemon's own lines, the guard and the doctor: tests/reliability/test_escaping.py."""

from __future__ import annotations

import json

import pytest

from rdmad.api import documents as docs
from rdmad.ctl.render.config import config_lines
from rdmad.ctl.render.formats import Style
from rdmad.ctl.render.history import event_line
from rdmad.ctl.render.saved import offline_lines
from rdmad.ctl.render.status import status_lines, trigger_lines
from rdmad.model import AttrStatus, ObjectDetail, ObjectState, VfStatus
from rdmad.status import HistoryEntry, ObjectReport, StatusSnapshot
from tests.ctl.conftest import NOW, ApiStub, ctl
from tests.reliability.test_escaping import (
    COMM,
    CONFIG_VALUE,
    NETDEV,
    NEWLINE,
    OUR_SGR,
    raw_controls,
)
from tests.support.fakesysfs import MLX5_VFS

S = ObjectState


# --- rdmad-ctl -----------------------------------------------------------------------------


def hostile_status() -> dict[str, object]:
    """A status document as the daemon builds it, with hostile names in every field a
    table shows: a holder's comm, a netdev name, a config value in a reason."""
    holder = f"pid 4242 ({COMM}) holds /dev/vfio/14"
    vf = VfStatus(
        1, MLX5_VFS[1], NETDEV, "vfio-pci", S.DRIFT_IN_USE, f"in use: {holder}", "in-use",
        (holder,),
        (AttrStatus("mac", CONFIG_VALUE, "02:00:00:00:00:09", S.DRIFT_IN_USE, f"{NEWLINE}"),),
    )  # fmt: skip
    detail = ObjectDetail(
        "sriov", {"pf": f"name={NETDEV}", "numvfs": 2}, {"pci": "0000:3b:00.0", "numvfs": 2},
        (AttrStatus("numvfs", 2, 2, S.CONVERGED),), (vf,),
    )  # fmt: skip
    report = ObjectReport(
        f"sriov name={NETDEV}", S.DRIFT_IN_USE, f"VF 1 differs, in use: {holder}", detail=detail
    )
    snap = StatusSnapshot(
        objects=(report,), passes=2, ready=True, notes=(f"netdev {NETDEV} {COMM}",),
        config_errors=(f"/etc/rdmad/rdmad.toml: sriov[0].vf[1].mac: not a MAC: {CONFIG_VALUE}",),
    )  # fmt: skip
    return json.loads(docs.dumps(docs.status_doc(snap, docs.DaemonFacts(812, NOW - 60))))


def hostile_history() -> dict[str, object]:
    entries = [
        HistoryEntry(NOW - 5, "failed", f"sriov name={NETDEV}", f"{NETDEV}: mac -> x",
                     f"held by {COMM}", "udev", error=f"{NEWLINE}\x1b[2J", errno=16),
    ]  # fmt: skip
    return docs.history_doc(entries, docs.HistoryQuery())


@pytest.mark.parametrize("argv", [("status",), ("status", "-v"), ("history",)])
def test_rdmad_ctl_tables_carry_no_raw_control_byte(api: ApiStub, argv: tuple[str, ...]) -> None:
    api.json("GET /v1/status", hostile_status())
    api.json("GET /v1/history", hostile_history())
    result = ctl(*argv, socket=api.socket)
    assert raw_controls(result.out) == [], result.out
    assert raw_controls(result.err) == []
    # ... and the escaped text is there to read, not dropped.
    shown = "\\x1b]0;pwned\\x07" if argv[0] == "status" else "\\x1b[2J"
    assert shown in result.out


def test_rdmad_ctl_json_keeps_the_exact_string(api: ApiStub) -> None:
    api.json("GET /v1/status", hostile_status())
    out = ctl("status", "--json", socket=api.socket).out
    assert raw_controls(out) == []  # JSON escapes them itself ...
    holders = json.loads(out)["objects"][0]["vfs"][0]["holders"]
    assert holders == [f"pid 4242 ({COMM}) holds /dev/vfio/14"]  # ... and keeps them exact


def test_in_colour_the_only_escapes_are_rdmads_own() -> None:
    lines = status_lines(hostile_status(), NOW, True, Style(True))
    text = "\n".join(lines)
    assert OUR_SGR.search(text)  # colour is on
    assert raw_controls(OUR_SGR.sub("", text)) == []


def test_watch_config_and_offline_lines_escape() -> None:
    status_event = json.dumps({"converged": False, "counts": {COMM: 1}, "passes": 1})
    history_event = json.dumps(hostile_history()["entries"][0])  # type: ignore[index]
    lines = [
        event_line("status", status_event, NOW),
        event_line("history", history_event, NOW),
        event_line(COMM, COMM, NOW),  # an event this rdmad-ctl does not know
        *config_lines(
            {"files": [f"/etc/rdmad/rdmad.d/{COMM}.toml"], "errors": [CONFIG_VALUE],
             "values": [{"key": "rxe[0].netdev.name", "value": NETDEV, "file": COMM}]}
        ),
        *trigger_lines("reload", {"pass": 3, "summary": COMM, "converged": True}, 1.0),
        *offline_lines(
            {"file": "/var/lib/rdmad/state.json", "readable": True, "problem": COMM,
             "written_at": NOW, "managed_rxe": [NETDEV],
             "applied": {NETDEV: {"at": NOW, "what": COMM, "reason": NEWLINE}},
             "last_errors": {NETDEV: {"at": NOW, "failures": 2, "error": COMM}},
             "history": hostile_history()["entries"]},
            NOW,
        ),
    ]  # fmt: skip
    for line in lines:
        assert "\n" not in line and raw_controls(line) == [], line
