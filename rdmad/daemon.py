"""The daemon: wiring only. Config, logging, signals, sd_notify, host, event sources -> agent.

Order matters: the event sources subscribe before the first observation, so
nothing that happens between "looked" and "listening" is missed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from rdmad import config, logs, state
from rdmad.agent import Agent, AgentOptions, Host
from rdmad.api.metrics import Metrics
from rdmad.clock import SystemClock
from rdmad.model import ApiSpec, DaemonSpec, MetricsSpec
from rdmad.state import StateStore
from rdmad.triggers import Trigger, TriggerQueue

if TYPE_CHECKING:
    from rdmad.api import ApiServer

log = structlog.get_logger("rdmad.daemon")

EXIT_OK, EXIT_FAIL = 0, 1
BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True, slots=True)
class RunOptions:
    config: Path = config.DEFAULT_DIR
    dry_run: bool = False
    log_level: str | None = None  # None: [daemon] log_level from the config
    log_format: str | None = None


class SdNotifier:
    """sd_notify through the sdnotify library; a no-op when NOTIFY_SOCKET is unset."""

    def __init__(self) -> None:
        self._sock = None
        if os.environ.get("NOTIFY_SOCKET"):
            import sdnotify

            self._sock = sdnotify.SystemdNotifier()

    def notify(self, state: str) -> None:
        if self._sock is not None:
            # sdnotify encodes latin-1 and silently drops what does not fit.
            self._sock.notify(state.encode("latin-1", "replace").decode("latin-1"))


def watchdog_interval() -> float | None:
    """Half of WATCHDOG_USEC, if systemd asked for pings from this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None


def read_boot_id() -> str:
    try:
        with open(BOOT_ID) as fh:
            return fh.read().strip()
    except OSError:
        return ""


class _Source:
    """An async iterable of Triggers with a name (for status when it stops)."""

    def __init__(self, name: str, gen: AsyncIterator[Trigger]) -> None:
        self.name = name
        self._gen = gen

    def __aiter__(self) -> AsyncIterator[Trigger]:
        return self._gen


async def _udev_triggers(monitor: object) -> AsyncIterator[Trigger]:
    from rdmad.kernel.udev import UdevMonitor

    assert isinstance(monitor, UdevMonitor)
    async for e in monitor:
        yield Trigger(
            "udev",
            e.describe(),
            # A rename or removal makes names in a plan made before it unreliable.
            stale=e.action in ("move", "remove", "resync"),
            # Module add/remove tells a driver reload apart in history; PCI bind/unbind
            # does not (rdmad's own numvfs and driver changes cause those).
            driver=e.subsystem == "module",
            touches=_names(e.sysname, e.interface, e.old_name, e.ifindex),
            # A netdev or RDMA device event changes only those: a cheap pass may do.
            narrow=e.subsystem in ("net", *_RDMA_SUBSYSTEMS) and e.action != "resync",
            rdma=e.subsystem in _RDMA_SUBSYSTEMS,
            removed=e.action == "remove",
        )


async def _link_triggers(stream: object) -> AsyncIterator[Trigger]:
    from rdmad.kernel.linkevents import LinkEventStream

    assert isinstance(stream, LinkEventStream)
    async for e in stream:
        renamed = e.old_name is not None and e.old_name != e.name
        what = f"{e.kind} {e.name or e.ifindex}" + (f" (was {e.old_name})" if renamed else "")
        yield Trigger(
            "netlink",
            what,
            stale=renamed or e.kind in ("del", "resync"),
            touches=_names(e.name, e.old_name, e.ifindex),
            narrow=e.kind != "resync",
        )


_RDMA_SUBSYSTEMS = ("infiniband", "infiniband_verbs")


def _names(*names: str | int | None) -> frozenset[str]:
    """What an event is about, in the vocabulary of model.action_touches()."""
    out = set()
    for n in names:
        if isinstance(n, int):
            if n > 0:
                out.add(f"ifindex:{n}")
        elif n:
            out.add(n)
    return frozenset(out)


def _event_sources() -> tuple[list[_Source], list[object]]:
    """Subscribe to udev and rtnetlink link events now; (sources, things to close)."""
    sources: list[_Source] = []
    closers: list[object] = []
    try:
        from rdmad.kernel.udev import UdevMonitor

        monitor = UdevMonitor()
        monitor.start()
        sources.append(_Source("udev", _udev_triggers(monitor)))
        closers.append(monitor)
        if monitor.source == "udev":
            # RDMA devices straight from the kernel as well: udevd's rules add nothing
            # rdmad needs to an RDMA device's removal, and waiting for them delays
            # putting back an rxe link someone deleted (udev's copy follows, harmless).
            early = UdevMonitor(_RDMA_SUBSYSTEMS, source="kernel")
            early.start()
            sources.append(_Source("uevent", _udev_triggers(early)))
            closers.append(early)
    except Exception as exc:  # no udev (container): rtnetlink and drift still work
        log.warning("source.unavailable", source="udev", error=str(exc))
    try:
        from rdmad.kernel.linkevents import LinkEventStream

        stream = LinkEventStream()
        sources.append(_Source("rtnetlink", _link_triggers(stream)))
        closers.append(stream)
    except Exception as exc:
        log.warning("source.unavailable", source="rtnetlink", error=str(exc))
    return sources, closers


def _make_host(dry_run: bool) -> tuple[Host, object]:
    from rdmad.kernel.dryrun import RecordingHost
    from rdmad.kernel.host import KernelHost

    kernel = KernelHost("/")
    if dry_run:
        return RecordingHost(kernel.observe), kernel
    return kernel, kernel


def _initial_spec(location: Path) -> DaemonSpec:
    """Logging and state-dir settings from whatever part of the config is readable.

    Never raises: a config that cannot be read or is invalid must not end the
    daemon (Restart=on-failure would loop on it); the agent reports its errors.
    """
    try:
        return config.daemon_settings(location)
    except Exception:  # an unforeseen failure: start with defaults, load_config reports it
        return DaemonSpec()


def _load_config(location: Path) -> config.LoadedConfig:
    """config.load with anything it did not foresee turned into a config error.

    load() reports every problem on disk as ConfigInvalid; this is the last line
    behind it, because an exception here would end the daemon, and systemd would
    restart it into the same config again and again.
    """
    try:
        return config.load(location)
    except config.ConfigInvalid:
        raise
    except Exception as exc:
        raise config.ConfigInvalid(
            [config.ConfigError(str(location), "", f"cannot be loaded: {exc!r}")]
        ) from exc


def _metrics_spec(location: Path) -> MetricsSpec:
    """[metrics] from whatever part of the config is readable; never raises (an
    invalid config must not stop the daemon, nor its metrics)."""
    try:
        return config.metrics_settings(location)
    except Exception:
        return MetricsSpec()


class _Closeable(Protocol):
    async def close(self) -> None: ...


async def _start_exporters(metrics: Metrics, spec: MetricsSpec) -> list[_Closeable]:
    """The textfile writer and TCP listener the config asks for. One that cannot start
    is logged and left out: the daemon's job is the node, not its metrics."""
    started: list[_Closeable] = []
    if spec.textfile_dir:
        from rdmad.api.textfile import TextfileWriter

        writer = TextfileWriter(metrics, spec.textfile_dir, spec.textfile_interval)
        writer.start()
        started.append(writer)
        log.info("metrics.textfile", path=str(writer.path), interval=spec.textfile_interval)
    if spec.listen:
        from rdmad.api.metrics_http import start_tcp_listener

        try:
            listener = await start_tcp_listener(metrics, spec.listen)
        except (OSError, ValueError) as exc:
            log.error("metrics.listen-failed", listen=spec.listen, error=str(exc))
        else:
            started.append(listener)
            log.info("metrics.listen", listen=spec.listen, addresses=listener.addresses)
    return started


def _api_spec(location: Path) -> ApiSpec:
    """The ``[api]`` settings, from whatever part of the config is readable (never raises)."""
    try:
        return config.api_settings(location)
    except Exception:
        return ApiSpec()


async def _start_api(
    opts: RunOptions, agent: Agent, queue: TriggerQueue, metrics: Metrics
) -> ApiServer | None:
    """The local API, or None: a failure to start it is logged and the daemon runs on
    without it (keeping the node reconciled matters more than answering questions)."""
    spec = _api_spec(opts.config)
    if not spec.enabled:
        log.info("api.disabled", why="[api] enabled = false")
        return None
    from rdmad.api import ApiServer

    server = ApiServer(agent.status, queue, opts.config, spec, metrics=metrics)
    try:
        await server.start()
    except Exception as exc:
        log.error(
            "api.failed",
            socket=spec.socket,
            error=str(exc),
            consequence="running without the local API: rdmad-ctl cannot reach this daemon",
        )
        return None
    return server


async def serve(opts: RunOptions) -> int:
    spec = _initial_spec(opts.config)
    logs.configure(opts.log_level or spec.log_level, opts.log_format or spec.log_format)
    notifier = SdNotifier()
    clock = SystemClock()
    queue = TriggerQueue(clock)
    sources, closers = _event_sources()  # before the first observation
    host, kernel = _make_host(opts.dry_run)
    agent = Agent(
        host,
        lambda: _load_config(opts.config),
        clock=clock,
        queue=queue,
        state_store=StateStore(state.resolve_dir(spec.state_dir)),
        notifier=notifier,
        sources=sources,
        boot_id=read_boot_id(),
        options=AgentOptions(dry_run=opts.dry_run, watchdog_interval=watchdog_interval()),
    )
    metrics = Metrics(agent.status, queue)
    exporters = await _start_exporters(metrics, _metrics_spec(opts.config))
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, agent.stop)
    loop.add_signal_handler(signal.SIGINT, agent.stop)
    loop.add_signal_handler(signal.SIGHUP, agent.request_reload)
    log.info(
        "daemon.start",
        pid=os.getpid(),
        config=str(opts.config),
        dry_run=opts.dry_run,
        watchdog=agent.options.watchdog_interval,
    )
    # Before run(): the socket exists by the time the agent sends READY=1.
    api = await _start_api(opts, agent, queue, metrics)
    try:
        await agent.run()
    finally:
        if api is not None:
            await api.close()
        metrics.close()  # rdmad_up 0 in the textfile's last write
        for exporter in exporters:
            try:
                await exporter.close()
            except Exception:
                log.exception("metrics.close-failed", exporter=repr(exporter))
        for thing in (*closers, kernel):
            close = getattr(thing, "close", None)
            if close is not None:
                close()
    log.info("daemon.exit", status=agent.status.current.summary())
    return EXIT_OK


def run(opts: RunOptions) -> int:
    return asyncio.run(serve(opts))
