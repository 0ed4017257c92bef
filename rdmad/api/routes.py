"""The endpoints of docs/API.md. Handlers only read the store's snapshots and put
triggers; anything slow (files, observing the kernel) runs off the loop, bounded."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from rdmad import config
from rdmad.api import documents as docs
from rdmad.api import timeouts
from rdmad.api.auth import PEER
from rdmad.api.errors import ApiError
from rdmad.api.events import EventStreams
from rdmad.api.waiting import Closed, Waiters
from rdmad.kernel.pause import MAX_PAUSE, clear_pause, end_pause, write_pause
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Observed
from rdmad.snapshot import snapshot_doc
from rdmad.status import API_VERSION, StatusSnapshot, StatusView
from rdmad.triggers import Trigger, TriggerQueue

MAX_BODY = 64 * 1024
PLAN_TIMEOUT = 10.0
MUTATION_WAIT = 30.0  # default ?wait= of reload and reconcile
MUTATION_WAIT_MAX = 600.0
STATUS_WAIT_MAX = 600.0  # ?wait= of /v1/status: until converged (rdmad-ctl wait)
SNAPSHOT_TIMEOUT = 30.0


class MetricsLike(Protocol):
    """What /metrics needs (rdmad.api.metrics.Metrics)."""

    def render(self) -> bytes: ...


@dataclass
class Routes:
    store: StatusView
    queue: TriggerQueue
    config_location: Path
    events: EventStreams
    waiters: Waiters
    observe: Callable[[], Observed]
    metrics: MetricsLike | None = None  # None: this build has no metrics module
    metrics_content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    request_timeout: float = 5.0
    api_notes: tuple[str, ...] = ()
    unit: str | None = None  # the systemd unit the daemon runs as (rdmad.api.ownunit)
    started_at: float = field(default_factory=time.time)
    pause_root: str = "/"  # where run/rdmad/pause.json lives (a tree in tests)
    _snapshot_busy: bool = field(default=False, init=False)
    # The last /v1/status body and what it was made from: snapshots are immutable, so
    # readers between two passes (a fleet's scrapes, `watch`) share one rendering.
    _status_body: tuple[StatusSnapshot, docs.DaemonFacts, bytes] | None = field(
        default=None, init=False
    )
    _status_renderer: docs.StatusRenderer = field(
        default_factory=lambda: docs.StatusRenderer(docs.dumps), init=False
    )

    def register(self, app: web.Application) -> None:
        app.router.add_get("/v1/status", self.status)
        app.router.add_get("/v1/plan", self.plan)
        app.router.add_get("/v1/history", self.history)
        app.router.add_get("/v1/config", self.config)
        app.router.add_post("/v1/reload", self.reload)
        app.router.add_post("/v1/reconcile", self.reconcile)
        app.router.add_post("/v1/pause", self.pause)
        app.router.add_delete("/v1/pause", self.resume)
        app.router.add_get("/v1/snapshot", self.snapshot)
        app.router.add_get("/v1/events", self.stream)
        app.router.add_get("/v1/metrics", self.metrics_text)
        app.router.add_get("/metrics", self.metrics_text)

    # --- reads -----------------------------------------------------------------------------

    async def status(self, request: web.Request) -> web.Response:
        """The status now, as the last pass left it; with ``?wait=S``, once a pass that
        began after the request says the node is converged, or S seconds have passed,
        whichever is first (``rdmad-ctl wait``: no polling).

        A wait asks for a pass of its own (a trigger, coalesced with whatever else is
        queued, as /v1/plan's): the last pass's verdict may predate what the caller
        just did (`modprobe igb`, a value set by hand that only the drift check would
        see) or news rdmad has not read yet, and "converged" must mean the node now.
        """
        try:
            wait = docs.wait_seconds(request.query, 0.0, STATUS_WAIT_MAX)
        except docs.BadQuery as exc:
            raise ApiError(400, str(exc)) from None
        answered: bool | None = None
        if wait > 0:
            number = self.queue.put(Trigger("api", "wait"))

            def fresh() -> bool:
                return self.store.current.answered >= number

            await self._wait(lambda: fresh() and self.store.current.converged, wait)
            answered = fresh()
        facts = docs.DaemonFacts(
            os.getpid(), self._daemon_started_at(), self.api_notes, answered, self.unit
        )
        snap = self.store.current
        cached = self._status_body
        if cached is None or cached[0] is not snap or cached[1] != facts:
            cached = (snap, facts, self._status_renderer.render(snap, facts))
            self._status_body = cached
        return web.Response(body=cached[2], content_type="application/json")

    def _daemon_started_at(self) -> float | None:
        starts = [e.at for e in self.store.history() if e.event == "start"]
        return starts[-1] if starts else self.started_at

    async def plan(self, request: web.Request) -> web.Response:
        """The daemon's own next pass, planned now and not applied."""
        _no_params(request)
        number = self.queue.put(Trigger("api", "plan", plan_only=True))

        def answered() -> bool:
            plan = self.store.plan
            return (plan is not None and plan.answered >= number) or (
                self.store.current.answered >= number
            )

        if not await self._wait(answered, PLAN_TIMEOUT):
            raise ApiError(503, f"no plan within {PLAN_TIMEOUT:g} s (is a pass stuck?)")
        plan = self.store.plan
        if plan is None or plan.answered < number:
            # The pass that took the request failed before planning (observe failed).
            notes = "; ".join(self.store.current.notes) or "the pass failed"
            raise ApiError(503, f"no plan: {notes}")
        return _json(docs.plan_doc(plan))

    async def history(self, request: web.Request) -> web.Response:
        try:
            query = docs.HistoryQuery.parse(request.query)
        except docs.BadQuery as exc:
            raise ApiError(400, str(exc)) from None
        return _json(docs.history_doc(self.store.history(), query))

    async def config(self, request: web.Request) -> web.Response:
        _no_params(request)
        eff = await asyncio.to_thread(config.effective, self.config_location)
        return _json(
            {
                "api": API_VERSION,
                "location": str(self.config_location),
                "files": list(eff.files),
                "ok": eff.ok,
                "errors": [str(e) for e in eff.errors],
                "config": eff.merged,
                "values": [
                    {"key": v.key, "value": v.value, "file": v.file, "file_key": v.file_key}
                    for v in eff.values
                ],
            }
        )

    async def snapshot(self, request: web.Request) -> web.Response:
        """The node's live state in config format, observed in a thread with a deadline
        (one at a time: a stuck observation must not pile up threads)."""
        _no_params(request)
        if self._snapshot_busy:
            raise ApiError(503, "a snapshot is already being taken; try again")
        self._snapshot_busy = True
        job = asyncio.ensure_future(asyncio.to_thread(self._take_snapshot))
        job.add_done_callback(self._snapshot_done)
        try:
            async with timeouts.timeout(SNAPSHOT_TIMEOUT):
                doc = await asyncio.shield(job)
        except asyncio.TimeoutError:
            raise ApiError(503, f"observing the node took over {SNAPSHOT_TIMEOUT:g} s") from None
        except OSError as exc:
            raise ApiError(503, f"cannot observe the node: {exc}") from None
        return _json(doc)

    def _snapshot_done(self, job: asyncio.Future[dict[str, Any]]) -> None:
        self._snapshot_busy = False
        if not job.cancelled():
            job.exception()  # retrieved here when the request gave up waiting

    def _take_snapshot(self) -> dict[str, Any]:
        return {"api": API_VERSION, **snapshot_doc(self.observe(), "this host")}

    async def stream(self, request: web.Request) -> web.StreamResponse:
        _no_params(request)
        return await self.events.handle(request)

    async def metrics_text(self, request: web.Request) -> web.Response:
        _no_params(request)
        if self.metrics is None:
            raise ApiError(404, "this rdmad has no metrics module")
        body = self.metrics.render()
        return web.Response(body=body, headers={"Content-Type": self.metrics_content_type})

    # --- mutations -------------------------------------------------------------------------

    async def reload(self, request: web.Request) -> web.Response:
        return await self._mutation(request, Trigger("api", "reload", reload=True))

    async def reconcile(self, request: web.Request) -> web.Response:
        return await self._mutation(request, Trigger("api", "reconcile"))

    async def pause(self, request: web.Request) -> web.Response:
        """Stand back (no module loads, no rxe creation) for ``seconds``, e.g. around a
        manual stack maintenance; ends early when the RDMA core is loaded again."""
        body = await self._check_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, 'the body must be a JSON object: {"seconds": N, "reason": "..."}')
        seconds, reason = body.get("seconds"), body.get("reason", "rdmad-ctl pause")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ApiError(400, "seconds: a number of seconds is required")
        if not 1 <= seconds <= MAX_PAUSE:
            raise ApiError(400, f"seconds: must be between 1 and {MAX_PAUSE:g}")
        if not isinstance(reason, str) or not 0 < len(reason) <= 200:
            raise ApiError(400, "reason: a text of 1 to 200 characters")
        peer = request.get(PEER)
        who = f"rdmad-ctl pause (uid {peer.uid}, pid {peer.pid})" if peer else "the API"
        try:
            write_pause(
                Sysfs(self.pause_root),
                by=who,
                reason=reason,
                seconds=float(seconds),
                modules=["ib_core"],
                now=time.time(),
            )
        except OSError as exc:
            raise ApiError(500, f"the pause could not be written: {exc}") from None
        return await self._mutation(request, Trigger("api", "pause"), checked=True)

    async def resume(self, request: web.Request) -> web.Response:
        peer = request.get(PEER)
        who = f"rdmad-ctl resume (uid {peer.uid}, pid {peer.pid})" if peer else "the API"
        try:  # kept as ended, saying by whom: the history tells why the pause ended
            end_pause(Sysfs(self.pause_root), why=f"ended by {who}", now=time.time())
        except OSError:
            clear_pause(Sysfs(self.pause_root))
        return await self._mutation(request, Trigger("api", "resume"))

    async def _mutation(
        self, request: web.Request, trigger: Trigger, *, checked: bool = False
    ) -> web.Response:
        if not checked:
            await self._check_body(request)
        try:
            wait = docs.wait_seconds(request.query, MUTATION_WAIT, MUTATION_WAIT_MAX)
        except docs.BadQuery as exc:
            raise ApiError(400, str(exc)) from None
        number = self.queue.put(trigger)
        answered = False
        if wait > 0:
            answered = await self._wait(lambda: self.store.current.answered >= number, wait)
        snap = self.store.current
        doc = {
            "api": API_VERSION,
            "queued": True,
            "trigger": number,
            "answered": answered,
            "pass": snap.passes,
            "seconds": snap.last_pass_seconds,
            "summary": snap.summary(),
            "converged": docs.converged(snap),
            "verdict": snap.verdict().to_json(),
        }
        return _json(doc, status=200 if answered else 202)

    async def _check_body(self, request: web.Request) -> Any:
        """Empty (None) or JSON (parsed), at most 64 KiB, arriving within the time limit."""
        if request.content_length is not None and request.content_length > MAX_BODY:
            size = request.content_length
            raise ApiError(413, f"request body too large ({size} bytes; limit 64 KiB)")
        try:
            async with timeouts.timeout(self.request_timeout):
                body = await request.read()
        except asyncio.TimeoutError:
            raise ApiError(
                408, f"the request body did not arrive within {self.request_timeout:g} s"
            ) from None
        if not body.strip():
            return None
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the body is not JSON: {exc}") from None

    async def _wait(self, condition: Callable[[], bool], timeout: float) -> bool:
        try:
            return await self.waiters.until(condition, timeout)
        except Closed:
            raise ApiError(503, "the daemon is stopping") from None


def _no_params(request: web.Request) -> None:
    if request.query:
        names = ", ".join(sorted(request.query))
        raise ApiError(400, f"{request.path} takes no parameters (got {names})")


def _json(doc: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(doc, status=status, dumps=docs.dumps)
