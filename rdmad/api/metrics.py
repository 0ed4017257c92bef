"""Prometheus metrics: what the status store and the trigger queue say, as numbers.

``Metrics`` owns a private ``CollectorRegistry`` (nothing else in the process leaks
into rdmad's output). Two kinds of metric, so that metrics never slow the reconcile
loop:

* counters and the pass-duration histogram are bumped by a store listener, which runs
  on the loop right after each change and does nothing but increment;
* everything that describes *now* (objects by state, VFs per PF, readiness ...) is
  computed at scrape time from the current immutable snapshot by ``_NowCollector``.

``render()`` must run on the event loop's thread (it reads the trigger queue's
counters, which only that thread changes). The metric list is docs/METRICS.md.
"""

from __future__ import annotations

import errno
import platform
import time
from collections.abc import Iterable, Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from rdmad import __version__
from rdmad.model import ObjectState
from rdmad.status import Change, HistoryEntry, StatusSnapshot, StatusView
from rdmad.triggers import TriggerQueue

# The Content-Type of ``render()``'s output.
CONTENT_TYPE = CONTENT_TYPE_LATEST

# A pass over a quiet node takes a few ms; one that waits for VFs to appear or a slow
# driver can take tens of seconds (the agent's per-action budgets end there).
DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

# History events that are the outcome of an action (rdmad_actions_total's outcome label).
ACTION_OUTCOMES = frozenset({"applied", "failed", "recorded", "stale"})

# The client library would add a `_created` series beside every counter and histogram;
# they double the output and no dashboard uses them (this is the library's public switch).
disable_created_metrics()  # type: ignore[no-untyped-call]


class Metrics:
    """rdmad's metrics over a status view and the trigger queue.

    It subscribes to the store at once; ``earlier`` is what the store published
    before (``rdmad.services.EarlyChanges``), so no pass or history entry is missed.
    ``close()`` unsubscribes.
    """

    def __init__(
        self,
        status: StatusView,
        queue: TriggerQueue | None = None,
        *,
        version: str = __version__,
        started_at: float | None = None,
        earlier: Iterable[Change] = (),
    ) -> None:
        self.status = status
        self.queue = queue
        self.registry = CollectorRegistry()
        r = self.registry
        self._passes = Counter(
            "rdmad_reconcile_passes", "Reconcile passes run (plan-only requests excluded).",
            registry=r,
        )  # fmt: skip
        self._duration = Histogram(
            "rdmad_reconcile_duration_seconds",
            "How long reconcile passes took: observe, plan and apply.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self._actions = Counter(
            "rdmad_actions",
            "Actions by kind (set-numvfs, set-vf, add-rxe ...) and outcome "
            "(applied, failed, recorded in a dry run, stale: not applied, re-planned).",
            ["kind", "outcome"],
            registry=r,
        )
        self._kernel_errors = Counter(
            "rdmad_kernel_errors",
            "Failed kernel writes by errno name.",
            ["errno"],
            registry=r,
        )
        Info("rdmad_build", "rdmad's version and the Python running it.", registry=r).info(
            {"version": version, "python": platform.python_version()}
        )
        self._up = Gauge("rdmad_up", "1 while rdmad runs; 0 once it stopped cleanly.", registry=r)
        self._up.set(1)
        Gauge("rdmad_start_time_seconds", "When rdmad started (Unix time).", registry=r).set(
            time.time() if started_at is None else started_at
        )
        self.last_success: float | None = None
        # What the store published before this existed (the daemon imports the metrics
        # library once the first pass rests): counted as if heard then.
        self._seen_passes = 0
        for change in earlier:
            self._on_change(change)
        # Passes that happened before we looked count, but have no duration to observe.
        now = status.current
        if now.passes > self._seen_passes:
            self._passes.inc(now.passes - self._seen_passes)
            self._seen_passes = now.passes
        if now.passes:
            self._note_success(now)
        r.register(_NowCollector(self))
        status.subscribe(self._on_change)

    def render(self) -> bytes:
        """The Prometheus text exposition (``CONTENT_TYPE``); on the loop's thread."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """rdmad is stopping: ``rdmad_up`` drops to 0 (a textfile written after this
        says so to whoever reads it later); stop listening to the store."""
        self._up.set(0)
        self.status.unsubscribe(self._on_change)

    # --- the store listener: runs on the loop after each change; increments only ---------

    def _on_change(self, change: Change) -> None:
        what, value = change
        if what == "status":
            self._on_status(value)
        elif what == "history":
            self._on_history(value)

    def _on_status(self, snap: StatusSnapshot) -> None:
        grown = snap.passes - self._seen_passes
        if grown <= 0:
            return  # the same pass republished (e.g. READY=1 set)
        self._seen_passes = snap.passes
        self._passes.inc(grown)
        if snap.last_pass_seconds is not None:
            self._duration.observe(snap.last_pass_seconds)
        self._note_success(snap)

    def _note_success(self, snap: StatusSnapshot) -> None:
        if (
            snap.last_pass_ok
            and snap.last_pass_at is not None
            and snap.count(ObjectState.DEGRADED) == 0
        ):
            self.last_success = snap.last_pass_at

    def _on_history(self, entry: HistoryEntry) -> None:
        if entry.event not in ACTION_OUTCOMES:
            return
        self._actions.labels(entry.kind or "unknown", entry.event).inc()
        if entry.event == "failed" and entry.errno is not None:
            self._kernel_errors.labels(errno_name(entry.errno)).inc()


# Where two names share a number, the one the kernel and its docs use (Python's table
# picks ENOTSUP for 95; drivers return EOPNOTSUPP).
_KERNEL_NAMES = {errno.EOPNOTSUPP: "EOPNOTSUPP"}


def errno_name(number: int) -> str:
    """EINVAL for 22; the number itself for one this Python does not name."""
    return _KERNEL_NAMES.get(number) or errno.errorcode.get(number, str(number))


class _NowCollector(Collector):
    """The gauges that describe the node now, computed from the snapshot at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def describe(self) -> Iterator[Metric]:
        # Names only (for the registry's collision check); no samples, no snapshot read.
        return iter(_Now().all())

    def collect(self) -> Iterator[Metric]:
        snap = self._m.status.current
        now = _Now()
        for state in ObjectState:
            now.objects.add_metric([state.value], snap.count(state))
        unsupported = in_use = 0
        for report in snap.objects:
            # Which object is degraded (e.g. "peermem": required but not loaded), for
            # alerts that must name it; rdmad_objects only counts them.
            now.degraded.add_metric([report.obj], 1 if report.state is ObjectState.DEGRADED else 0)
            d = report.detail
            if d is None:
                continue
            if d.kind == "rdma" and d.observed.get("netns_mode") in _NETNS_MODES:
                for mode in _NETNS_MODES:
                    now.netns_mode.add_metric([mode], 1 if d.observed["netns_mode"] == mode else 0)
            if d.kind == "sriov":
                pf = str(d.desired.get("pf") or report.obj)
                desired_n = _count(d.desired.get("numvfs"))
                present_n = _count(d.observed.get("numvfs"))
                if desired_n is not None:
                    now.vfs_desired.add_metric([pf], desired_n)
                if present_n is not None:
                    now.vfs_present.add_metric([pf], present_n)
                # Only when declared: the kernel's default (1) is no news on other PFs.
                autoprobe = d.observed.get("autoprobe")
                if d.desired.get("autoprobe") is not None and isinstance(autoprobe, bool):
                    now.autoprobe.add_metric([pf], 1 if autoprobe else 0)
                eswitch = d.observed.get("eswitch")
                seen = eswitch.get("mode") if isinstance(eswitch, dict) else None
                if d.desired.get("eswitch") is not None and seen in _ESWITCH_MODES:
                    for mode in _ESWITCH_MODES:
                        now.eswitch.add_metric([pf, mode], 1 if seen == mode else 0)
                guard = d.observed.get("guard")
                if isinstance(guard, str) and not guard.startswith(_GUARD_NOT_WANTED):
                    now.guard.add_metric([pf], 1 if guard.startswith("installed") else 0)
            attrs = [*d.attributes, *(a for vf in d.vfs for a in vf.attributes)]
            unsupported += sum(1 for a in attrs if a.state is ObjectState.UNSUPPORTED)
            blocked_vfs = sum(
                1 for vf in d.vfs if vf.state is ObjectState.BLOCKED and vf.usage != "free"
            )
            in_use += blocked_vfs
            # An object blocked as a whole because it is in use (an rxe link with users).
            if (
                not blocked_vfs
                and report.state is ObjectState.BLOCKED
                and d.observed.get("usage") not in (None, "free")
            ):
                in_use += 1
        now.unsupported.add_metric([], unsupported)
        now.in_use.add_metric([], in_use)
        # The node's verdict (rdmad.model.status.node_verdict), the one rdmad-ctl and
        # /v1/status give: the RdmadNotConverged alert reads it rather than re-deriving it.
        now.converged.add_metric([], 1 if snap.converged else 0)
        now.passes_failing.add_metric([], 0 if snap.pass_error is None else 1)
        now.ready.add_metric([], 1 if snap.ready else 0)
        now.paused.add_metric([], 1 if snap.pause is not None else 0)
        now.config_valid.add_metric([], 0 if snap.config_errors else 1)
        if self._m.last_success is not None:
            now.last_success.add_metric([], self._m.last_success)
        if self._m.queue is not None:
            # A copy first: iterating a Counter is only safe while nothing adds to it.
            for source, n in sorted(dict(self._m.queue.by_source).items()):
                now.events.add_metric([source], n)
        # A family without samples is left out (no last success yet, no queue).
        return (f for f in now.all() if f.samples)


# Guard states of a PF that has no hook to install: driver_guard off, a built-in driver.
_GUARD_NOT_WANTED = ("off", "not needed", "unknown")
_NETNS_MODES = ("shared", "exclusive")
_ESWITCH_MODES = ("legacy", "switchdev")


class _Now:
    """The scrape-time families, empty; ``collect`` fills them."""

    def __init__(self) -> None:
        g = GaugeMetricFamily
        self.objects = g("rdmad_objects", "Declared objects by state.", labels=["state"])
        self.degraded = g(
            "rdmad_object_degraded",
            "1 per object in state degraded, 0 per other object (object as in status).",
            labels=["object"],
        )
        self.vfs_desired = g(
            "rdmad_vfs_desired", "VFs declared per SR-IOV PF (numvfs).", labels=["pf"]
        )
        self.vfs_present = g(
            "rdmad_vfs_present", "VFs the kernel shows per SR-IOV PF.", labels=["pf"]
        )
        self.unsupported = g(
            "rdmad_attributes_unsupported",
            "Declared attributes (of objects and VFs) the driver refuses.",
            labels=[],
        )
        self.in_use = g(
            "rdmad_in_use_blocks",
            "VFs (and rxe links) whose change rdmad holds back because they are in use.",
            labels=[],
        )
        self.converged = g(
            "rdmad_converged",
            "1 when the node is converged (rdmad-ctl status exits 0), else 0.",
            labels=[],
        )
        self.passes_failing = g(
            "rdmad_passes_failing",
            "1 while reconcile passes fail before planning (observing the kernel failed); "
            "rdmad-ctl status says why.",
            labels=[],
        )
        self.ready = g(
            "rdmad_ready", "1 once the first reconcile finished (systemd READY=1).", labels=[]
        )
        self.guard = g(
            "rdmad_guard_installed",
            "1 when `modprobe -r` of a guarded PF's driver asks the guard, 0 when not (yet).",
            labels=["pf"],
        )
        self.autoprobe = g(
            "rdmad_sriov_autoprobe",
            "A PF's sriov_drivers_autoprobe (1: the host binds new VFs), with autoprobe "
            "declared for it.",
            labels=["pf"],
        )
        self.eswitch = g(
            "rdmad_sriov_eswitch_mode",
            "A PF's eSwitch mode (1 for it, 0 for the other), with eswitch declared for it "
            "and the mode read over devlink.",
            labels=["pf", "mode"],
        )
        self.netns_mode = g(
            "rdmad_rdma_netns_mode",
            "The RDMA netns mode in force (1 for it, 0 for the other), with [rdma] netns_mode "
            "declared and ib_core loaded.",
            labels=["mode"],
        )
        self.paused = g(
            "rdmad_paused",
            "1 while a guarded stop is in progress (no module loads, no rxe links).",
            labels=[],
        )
        self.config_valid = g(
            "rdmad_config_valid", "1 if the config on disk loaded without errors.", labels=[]
        )
        self.last_success = g(
            "rdmad_last_successful_reconcile_timestamp_seconds",
            "When the last pass with no failure (no degraded object, observe worked) ended.",
            labels=[],
        )
        self.events = CounterMetricFamily(
            "rdmad_events",
            "Triggers received by source (udev, netlink, drift, api ...).",
            labels=["source"],
        )

    def all(self) -> list[Metric]:
        return [
            self.objects,
            self.degraded,
            self.vfs_desired,
            self.vfs_present,
            self.unsupported,
            self.in_use,
            self.converged,
            self.passes_failing,
            self.ready,
            self.guard,
            self.autoprobe,
            self.eswitch,
            self.netns_mode,
            self.paused,
            self.config_valid,
            self.last_success,
            self.events,
        ]


def _count(value: object) -> int | None:
    """A VF count from detail; None when unset or not reported (bools are not counts)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


__all__ = ["CONTENT_TYPE", "DURATION_BUCKETS", "Metrics", "errno_name"]
