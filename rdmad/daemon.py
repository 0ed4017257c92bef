"""The daemon: wiring only. Config, logging, signals, sd_notify, host, event sources -> agent.

Order matters: the event sources subscribe before the first observation, so
nothing that happens between "looked" and "listening" is missed.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import structlog

from rdmad import config, logs, services, state
from rdmad.agent import Agent, AgentOptions, Host
from rdmad.clock import SystemClock
from rdmad.model import Desired
from rdmad.state import StateStore
from rdmad.triggers import VERBS_LAG, Trigger, TriggerQueue

if TYPE_CHECKING:
    from rdmad.kernel.events.udev import UdevEvent

log = structlog.get_logger("rdmad.daemon")

EXIT_OK, EXIT_FAIL = 0, 1
BOOT_ID = "/proc/sys/kernel/random/boot_id"


class RunOptions(msgspec.Struct, frozen=True):
    config: Path = config.DEFAULT_DIR
    dry_run: bool = False
    log_level: str | None = None  # None: [daemon] log_level from the config
    log_format: str | None = None
    # A sysfs/procfs tree observed instead of the host's (with dry_run only: a what-if
    # run against a copied or made-up node; the event sources still hear this host).
    root: str = "/"
    # A host directory (same path in the pod) for the guard's host copy: rdmad runs in a
    # container and the host has not its package (rdmad.kernel.guardkit).
    guard_kit: Path | None = None


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


def freeze_startup_heap() -> None:
    """Put every object start-up made (modules, classes, functions: ~45,000 once the API
    is imported) in the collector's permanent generation, out of every later collection.

    Start-up leaves the generation counters near their thresholds, so the first full
    collection comes within seconds, and it walks all of them: 17-21 ms on a normal host,
    ten times that under emulation, on the loop, in whatever event it lands on. (It was
    thought to be the slow first rxe re-create of bench_rxe; that sample is still slow
    with the heap frozen, bench/NOTES.md 2026-11-28, so its cause is elsewhere.) They live
    as long as the daemon: nothing is lost by never collecting them. No collection first:
    it would cost that same pause before the first pass.
    """
    gc.freeze()


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


async def _udev_triggers(events: AsyncIterable[UdevEvent]) -> AsyncIterator[Trigger]:
    async for e in events:
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
            announced=e.source == "kernel",
            # A verbs device goes with its RDMA device, whose own `remove` follows.
            lag=VERBS_LAG if e.subsystem == "infiniband_verbs" and e.action == "remove" else 0.0,
            echo=_echo(e),
        )


def _echo(e: UdevEvent) -> tuple[int, bool] | None:
    """What a netdev's add, rename or removal uevent repeats of the link news (see
    ``Trigger.echo``); None for any other event."""
    if e.subsystem != "net" or e.action not in ("add", "move", "remove") or not e.ifindex:
        return None
    return e.ifindex, e.action != "remove"


async def _link_triggers(stream: object) -> AsyncIterator[Trigger]:
    from rdmad.kernel.events.linkevents import LinkEventStream

    assert isinstance(stream, LinkEventStream)
    async for e in stream:
        if e.kind == "addr":
            # The queue keeps it only for a netdev whose addresses matter now
            # (TriggerQueue.address_watch); its netdevs are read again (no news).
            yield Trigger(
                "netlink", f"address of {e.name or e.ifindex}", narrow=True, address=e.ifindex
            )
            continue
        renamed = e.old_name is not None and e.old_name != e.name
        what = f"{e.kind} {e.name or e.ifindex}" + (f" (was {e.old_name})" if renamed else "")
        yield Trigger(
            "netlink",
            what,
            stale=renamed or e.kind in ("del", "resync"),
            touches=_names(e.name, e.old_name, e.ifindex),
            narrow=e.kind != "resync",
            added=e.kind == "add",
            link=None if e.kind == "resync" else (e.ifindex, e.message),
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
        from rdmad.kernel.events.udev import SUBSYSTEMS, UdevMonitor, default_source

        source = default_source()
        subsystems: tuple[str, ...] = SUBSYSTEMS
        if source == "udev" and _kernel_rdma_events(sources, closers):
            subsystems = tuple(s for s in SUBSYSTEMS if s not in _RDMA_SUBSYSTEMS)
        monitor = UdevMonitor(subsystems, source=source)
        monitor.start()
        sources.append(_Source("udev", _udev_triggers(monitor)))
        closers.append(monitor)
    except Exception as exc:  # no udev (container): rtnetlink and drift still work
        log.warning("source.unavailable", source="udev", error=str(exc))
    try:
        from rdmad.kernel.events.linkevents import LinkEventStream

        stream = LinkEventStream()
        sources.append(_Source("rtnetlink", _link_triggers(stream)))
        closers.append(stream)
    except Exception as exc:
        log.warning("source.unavailable", source="rtnetlink", error=str(exc))
    return sources, closers


def _wire_reflexes(host: Host, readers: list[object]) -> None:
    """Let the event readers send the rxe adds the agent armed (``kernel.events.reflex``): a
    new netdev's news and the kernel's own removal of an RDMA device. Not in a dry run
    (its host is a recorder, which has none)."""
    from rdmad.kernel.apply.host import KernelHost
    from rdmad.kernel.events.linkevents import LinkEventStream
    from rdmad.kernel.events.uevents import KernelUevents

    reflex = host.reflex if isinstance(host, KernelHost) else None
    if reflex is None:
        return

    def removed(e: UdevEvent) -> None:
        if e.action == "remove" and e.subsystem == "infiniband":
            reflex.rdma_removed(e.sysname)

    for reader in readers:
        if isinstance(reader, LinkEventStream):
            reader.on_added = reflex.netdev_added
        elif isinstance(reader, KernelUevents):
            reader.on_event = removed


def _kernel_rdma_events(sources: list[_Source], closers: list[object]) -> bool:
    """RDMA device events straight from the kernel, not through udevd: its rules add
    nothing rdmad needs to them, and its copy of each, parsed through pyudev (2-9 ms
    under emulation), would hold the loop just when the kernel's own removal should
    put back an rxe link someone deleted. False: not available (udevd's copies then)."""
    from rdmad.kernel.events.udev import WANTED
    from rdmad.kernel.events.uevents import KernelUevents

    early: KernelUevents | None = None
    try:
        early = KernelUevents({s: WANTED[s] for s in _RDMA_SUBSYSTEMS})
        early.start()
    except Exception as exc:
        if early is not None:
            early.close()
        log.warning("source.unavailable", source="uevent", error=str(exc))
        return False
    sources.append(_Source("uevent", _udev_triggers(early)))
    closers.append(early)
    return True


def _make_host(dry_run: bool, root: str = "/") -> tuple[Host, object]:
    from rdmad.kernel.apply.dryrun import RecordingHost
    from rdmad.kernel.apply.host import KernelHost

    kernel = KernelHost(root)
    if dry_run:
        return RecordingHost(kernel.observe), kernel
    return kernel, kernel


def _start_settings(location: Path) -> Desired:
    """[daemon] (logging, state directory), [api] and [metrics] from whatever part of the
    config is readable (``config.start_settings``).

    Never raises: a config that cannot be read or is invalid must not end the
    daemon (Restart=on-failure would loop on it); the agent reports its errors.
    """
    try:
        return config.start_settings(location)
    except Exception:  # an unforeseen failure: start with defaults, load_config reports it
        return Desired()


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


def command_line_keys(opts: RunOptions) -> tuple[str, ...]:
    """The config keys ``rdmad run``'s options set (they win over the config's)."""
    given = {"daemon.log_level": opts.log_level, "daemon.log_format": opts.log_format}
    return tuple(key for key, value in given.items() if value is not None)


async def serve(opts: RunOptions) -> int:
    settings = _start_settings(opts.config)
    spec = settings.daemon
    logs.configure(opts.log_level or spec.log_level, opts.log_format or spec.log_format)
    if opts.guard_kit is not None and not _install_guard_kit(opts.guard_kit, opts.dry_run):
        return EXIT_FAIL
    gate = services.ReadyGate(SdNotifier())
    clock = SystemClock()
    queue = TriggerQueue(clock)
    sources, closers = _event_sources()  # before the first observation
    host, kernel = _make_host(opts.dry_run, opts.root)
    _wire_reflexes(host, closers)
    agent = Agent(
        host,
        lambda: _load_config(opts.config),
        clock=clock,
        queue=queue,
        state_store=StateStore(state.resolve_dir(spec.state_dir)),
        notifier=gate,
        sources=sources,
        boot_id=read_boot_id(),
        options=AgentOptions(
            dry_run=opts.dry_run,
            watchdog_interval=watchdog_interval(),
            started_with=settings,
            command_line=command_line_keys(opts),
        ),
    )
    early = services.EarlyChanges(agent.status)  # metrics count the first pass too
    freeze_startup_heap()  # what the imports above made; the services' own follow
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
    # The API and metrics import and start once the first pass rests (rdmad.services);
    # READY=1 waits at the gate until the API socket exists.
    starting = loop.create_task(
        services.start_services(opts.config, settings, agent.status, queue, early, gate)
    )
    try:
        await agent.run()
    finally:
        started = await _stop_starting(starting)
        await started.close()
        for thing in (*closers, kernel):
            close = getattr(thing, "close", None)
            if close is not None:
                close()
        if opts.guard_kit is not None and not opts.dry_run:
            _remove_guard_hook(opts.root)
    log.info("daemon.exit", status=agent.status.current.summary())
    return EXIT_OK


def _install_guard_kit(directory: Path, dry_run: bool) -> bool:
    """The guard's host copy, before any hook names it; False (logged): rdmad must not
    run, since the hooks it would write could not run on the host. A dry run writes
    nothing: its plan names the hook a real run would write."""
    from rdmad.kernel import guardhook, guardkit

    if dry_run:
        hook = guardkit.hook_path(directory)
        guardhook.use_command(guardkit.hook_command(hook))
        log.info(
            "guard_kit.not_written", hook=hook, command=guardhook.guard_command(), why="dry run"
        )
        return True
    try:
        hook = guardkit.install(directory, guardhook.MODPROBE)
    except OSError as exc:
        log.error("guard_kit.failed", directory=str(directory), error=str(exc))
        return False
    guardhook.use_command(guardkit.hook_command(hook))
    log.info("guard_kit.installed", hook=hook, command=guardhook.guard_command())
    return True


def _remove_guard_hook(root: str) -> None:
    """On the way out of a container (the pod deleted): the hook goes with rdmad, so
    nothing on the host names a guard nobody keeps current. A crash leaves it, and the
    guard still judges from the kernel alone."""
    from rdmad.kernel import guardhook
    from rdmad.kernel.sysfs import Sysfs

    try:
        guardhook.write_hook(Sysfs(root), [], guardhook.guard_command())
    except OSError as exc:
        log.warning("guard_hook.remove_failed", error=str(exc))
    else:
        log.info("guard_hook.removed", reason="rdmad stops, and the host has no package")


async def _stop_starting(starting: asyncio.Task[services.Services]) -> services.Services:
    """The services that started; if they are still starting (a stop during start-up),
    what has started so far is not reachable: cancel, and close nothing of it."""
    if not starting.done():
        starting.cancel()
    try:
        return await starting
    except asyncio.CancelledError:
        return services.Services()


def run(opts: RunOptions) -> int:
    return asyncio.run(serve(opts))
