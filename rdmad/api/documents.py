"""The API's JSON documents, built from the store's immutable snapshots (docs/API.md).

Pure functions of what the agent published: no I/O, no clock, so a handler
builds a document in microseconds and the tests can check them directly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from rdmad import __version__
from rdmad.model import ObjectState
from rdmad.status import API_VERSION, HistoryEntry, ObjectReport, PlanReport, StatusSnapshot

HISTORY_DEFAULT_LIMIT = 200


class BadQuery(ValueError):
    """A query parameter that does not parse; the message names it."""


class DaemonFacts(msgspec.Struct, frozen=True):
    """What the status document says of the daemon beyond the snapshot."""

    pid: int
    started_at: float | None
    api_notes: tuple[str, ...] = ()  # the API's own problems (e.g. the socket is root-only)
    # For ``?wait=`` only: whether a pass that began after the request answered it (its
    # verdict is the document's); False: the document is an older pass's. None: not asked.
    answered: bool | None = None
    # The systemd unit the daemon runs as (rdmad.api.ownunit); None: not under systemd.
    unit: str | None = None


def converged(snap: StatusSnapshot) -> bool:
    """The node's verdict is converged (``rdmad.model.status.node_verdict``: the one
    definition the CLI, StatusText, the metrics and the alert share)."""
    return snap.converged


def counts(snap: StatusSnapshot) -> dict[str, int]:
    return {state.value: snap.count(state) for state in ObjectState}


def kind_of(obj: str) -> str:
    """``sriov``/``rxe`` from an object's name ("sriov pci=...", "rxe rxe0")."""
    return obj.split(" ", 1)[0]


def object_doc(report: ObjectReport) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "obj": report.obj,
        "kind": kind_of(report.obj),
        "state": report.state.value,
        "reason": report.message,
        "last_error": report.last_error,
        "errno": report.errno,
        "failures": report.failures,
        "retry_at": report.retry_at,
        "last_change": report.last_change,
        "desired": {},
        "observed": {},
        "attributes": [],
        "vfs": [],
    }
    if report.detail is not None:
        doc.update(report.detail.to_json())
    return doc


def status_doc(snap: StatusSnapshot, facts: DaemonFacts) -> dict[str, Any]:
    return {
        **_status_head(snap, facts),
        "objects": [object_doc(o) for o in snap.objects],
    }


def _status_head(snap: StatusSnapshot, facts: DaemonFacts) -> dict[str, Any]:
    return {
        "api": API_VERSION,
        "version": __version__,
        "summary": snap.summary(),
        "converged": converged(snap),
        **({} if facts.answered is None else {"answered": facts.answered}),
        "verdict": snap.verdict().to_json(),
        "daemon": {
            "pid": facts.pid,
            "unit": facts.unit,
            "ready": snap.ready,
            "dry_run": snap.dry_run,
            "start_kind": snap.start_kind,
            "boot_id": snap.boot_id,
            "started_at": facts.started_at,
            "passes": snap.passes,
            "last_pass_at": snap.last_pass_at,
            "last_pass_seconds": snap.last_pass_seconds,
            "last_cause": snap.last_cause,
            "last_pass_ok": snap.last_pass_ok,
            "pass_error": snap.pass_error,
            "config_ok": snap.config_ok,
            "config_errors": list(snap.config_errors),
            "config_files": list(snap.config_files),
            "notes": [*snap.notes, *facts.api_notes],
            "pause": None
            if snap.pause is None
            else {
                "by": snap.pause.by,
                "reason": snap.pause.reason,
                "since": snap.pause.since,
                "until": snap.pause.until,
                "modules": list(snap.pause.modules),
                "describe": snap.pause.describe(),
            },
        },
        "counts": counts(snap),
    }


def dumps(doc: Any) -> str:
    """JSON as the API sends it; TOML dates and times (not JSON types) as ISO text."""
    return json.dumps(doc, default=str)


class StatusRenderer:
    """``status_doc`` as JSON bytes, reusing each object's encoding while it is unchanged.

    Most of a status document is per-VF detail, and the reporter hands out the same
    ``ObjectDetail`` while a node rests, so a pass that changed nothing costs the next
    reader the small head only, not 64 VFs x 8 attributes through ``json.dumps``.
    """

    def __init__(self, dumps: Callable[[Any], str] = dumps) -> None:
        self._dumps = dumps
        self._objects: dict[str, tuple[ObjectReport, bytes]] = {}

    def render(self, snap: StatusSnapshot, facts: DaemonFacts) -> bytes:
        parts = [self._object(o) for o in snap.objects]
        self._objects = {o.obj: (o, b) for o, b in zip(snap.objects, parts, strict=True)}
        head = self._dumps(_status_head(snap, facts)).encode()
        return head[:-1] + b', "objects": [' + b", ".join(parts) + b"]}"

    def _object(self, report: ObjectReport) -> bytes:
        cached = self._objects.get(report.obj)
        if cached is not None and _same(cached[0], report):
            return cached[1]
        return self._dumps(object_doc(report)).encode()


def _same(a: ObjectReport, b: ObjectReport) -> bool:
    """Equal reports; the detail by identity (the reporter reuses it while unchanged)."""
    if a.detail is not b.detail:
        return False
    return msgspec.structs.replace(a, detail=None) == msgspec.structs.replace(b, detail=None)


def status_event(snap: StatusSnapshot) -> dict[str, Any]:
    """The short form an event stream carries on every status change."""
    return {
        "summary": snap.summary(),
        "converged": converged(snap),
        "verdict": snap.verdict().to_json(),
        "counts": counts(snap),
        "passes": snap.passes,
    }


def plan_doc(report: PlanReport) -> dict[str, Any]:
    return report.to_json("daemon")


class HistoryQuery(msgspec.Struct, frozen=True):
    obj: str | None = None
    since: float | None = None
    limit: int = HISTORY_DEFAULT_LIMIT

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> HistoryQuery:
        """From ``obj``, ``since`` (Unix time), ``limit`` (1..10000); BadQuery otherwise."""
        unknown = sorted(set(params) - {"obj", "since", "limit"})
        if unknown:
            raise BadQuery(f"unknown parameter(s): {', '.join(unknown)} (obj, since, limit)")
        since = None
        if "since" in params:
            since = _number(params["since"], "since")
        limit = HISTORY_DEFAULT_LIMIT
        if "limit" in params:
            try:
                limit = int(params["limit"])
            except ValueError:
                raise BadQuery(f"limit: not an integer: {params['limit']!r}") from None
            if not 1 <= limit <= 10_000:
                raise BadQuery(f"limit: must be 1..10000, got {limit}")
        obj = params.get("obj")
        return cls(obj or None, since, limit)

    def select(self, entries: Sequence[HistoryEntry]) -> list[HistoryEntry]:
        kept = [
            e
            for e in entries
            if (self.obj is None or e.obj == self.obj)
            and (self.since is None or e.at >= self.since)
        ]
        return kept[-self.limit :]


def history_doc(entries: Sequence[HistoryEntry], query: HistoryQuery) -> dict[str, Any]:
    return {"api": API_VERSION, "entries": [e.to_json() for e in query.select(entries)]}


def wait_seconds(params: Mapping[str, str], default: float, most: float) -> float:
    """``?wait=SECONDS`` of reload/reconcile (0 = do not wait) and of status (until
    converged), at most ``most``."""
    unknown = sorted(set(params) - {"wait"})
    if unknown:
        raise BadQuery(f"unknown parameter(s): {', '.join(unknown)} (wait)")
    if "wait" not in params:
        return default
    value = _number(params["wait"], "wait")
    if not 0 <= value <= most:
        raise BadQuery(f"wait: must be 0..{most:g} seconds, got {params['wait']}")
    return value


def _number(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise BadQuery(f"{name}: not a number: {text!r}") from None
    if not math.isfinite(value):
        raise BadQuery(f"{name}: not a finite number: {text!r}")
    return value
