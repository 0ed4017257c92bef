"""The agent and peermem: a lasting failure is reported and not retried until the facts
it failed on change or the config is reloaded; a passing one is retried with backoff."""

from __future__ import annotations

from dataclasses import dataclass, field

from structlog.testing import capture_logs

from rdmad.model import Action, Desired, LoadModule, ModulesObserved, Observed, ObserveScope
from rdmad.model.validation import validate
from rdmad.peermem.facts import ModuleFile, PeermemFacts
from tests.agent.conftest import FakeResult, FakeWrite, RigFactory

PEERMEM = ModuleFile("nvidia_peermem", "updates/dkms/nvidia-peermem.ko", True, False, 100)
MISMATCH = (
    "modprobe nvidia-peermem: modprobe: ERROR: could not insert 'nvidia_peermem': "
    "Invalid argument; kernel log: nvidia_peermem: disagrees about version of symbol "
    "ib_register_peer_memory_client"
)


@dataclass
class PeermemHost:
    """nvidia + ib_core loaded; modprobe of peermem fails with ``error`` (or loads it)."""

    loaded: set[str] = field(default_factory=lambda: {"nvidia", "ib_core", "mlx5_ib"})
    error: str | None = MISMATCH
    attempts: list[str] = field(default_factory=list)

    async def observe(self) -> Observed:
        f = PeermemFacts(
            release="6.1.0-26-amd64",
            loaded=frozenset(self.loaded),
            files=(PEERMEM,),
            peer_api=True,
        )
        return Observed(modules=ModulesObserved(frozenset(self.loaded), peermem=f))

    async def apply(self, action: Action) -> FakeResult:
        assert isinstance(action, LoadModule)
        self.attempts.append(action.module)
        if self.error is not None:
            err = RuntimeError(self.error)
            return FakeResult((FakeWrite(f"modprobe {action.module}", None, None, err),))
        self.loaded.add("nvidia_peermem")
        return FakeResult((FakeWrite(f"modprobe {action.module}", None, "loaded"),))


def peermem_config(mode: str = "auto") -> Desired:
    return validate(Desired, {"peermem": {"mode": mode}, "daemon": {"drift_interval": "1m"}})


async def test_lasting_failure_is_reported_once_and_not_retried(rig: RigFactory) -> None:
    host = PeermemHost()
    with capture_logs() as logs:
        r = rig(peermem_config(), host=host)  # type: ignore[arg-type]
        await r.start()
        await r.idle()
        passes = len(r.agent.passes)
        await r.advance(600.0, step=30.0)  # ten drift passes
        await r.idle()
    assert len(r.agent.passes) >= passes + 9  # the drift passes ran...
    assert host.attempts == ["nvidia-peermem"]  # ...and none of them ran modprobe again
    [report] = r.agent.status.current.objects
    assert report.obj == "peermem" and report.state.value == "blocked"
    assert "symbol-version-mismatch" in report.message and "DKMS" in report.message
    assert r.agent.backoff.get("peermem") is None  # not a backoff retry loop
    said = [e for e in logs if e["event"] == "peermem.cannot-load"]
    assert len(said) == 1 and said[0]["finding"] == "symbol-version-mismatch"

    # A config reload is how the user says "I fixed it": one more attempt, which works.
    host.error = None
    r.agent.request_reload()
    await r.idle()
    assert host.attempts == ["nvidia-peermem", "nvidia-peermem"]
    [report] = r.agent.status.current.objects
    assert report.state.value == "converged"
    await r.stop()


async def test_a_module_event_that_changes_the_facts_retries(rig: RigFactory) -> None:
    host = PeermemHost()
    r = rig(peermem_config("require"), host=host)  # type: ignore[arg-type]
    await r.start()
    await r.idle()
    assert host.attempts == ["nvidia-peermem"]
    [report] = r.agent.status.current.objects
    assert report.state.value == "degraded"  # require: not loaded is degraded
    # The RDMA stack restarts (a new ib_uverbs appears): the facts changed.
    host.loaded.add("ib_uverbs")
    host.error = None
    r.agent.trigger("udev", "add module ib_uverbs", driver=True)
    await r.idle()
    assert host.attempts == ["nvidia-peermem", "nvidia-peermem"]
    assert "nvidia_peermem" in host.loaded
    await r.stop()


async def test_a_passing_failure_backs_off(rig: RigFactory) -> None:
    host = PeermemHost(
        error="modprobe nvidia-peermem: modprobe: ERROR: could not insert "
        "'nvidia_peermem': Cannot allocate memory"
    )
    r = rig(peermem_config(), host=host)  # type: ignore[arg-type]
    await r.start()
    await r.idle()
    assert r.agent.backoff.get("peermem") is not None
    first = len(host.attempts)
    await r.advance(600.0, step=30.0)
    await r.idle()
    assert len(host.attempts) > first  # retried, with backoff
    await r.stop()


async def test_a_module_event_retries_even_when_the_loaded_set_is_the_same_again(
    rig: RigFactory,
) -> None:
    """An RDMA stack restart: ib_core goes and comes back, the loaded set is what it was
    when the load failed; the module event is what says "try again" (once)."""
    host = PeermemHost()
    r = rig(peermem_config(), host=host)  # type: ignore[arg-type]
    await r.start()
    await r.idle()
    assert host.attempts == ["nvidia-peermem"]
    r.agent.trigger("udev", "add module ib_core", driver=True)
    await r.idle()
    assert host.attempts == ["nvidia-peermem", "nvidia-peermem"]  # one more, then held
    await r.advance(300.0, step=30.0)
    await r.idle()
    assert len(host.attempts) == 2
    await r.stop()


@dataclass
class ScopedHost(PeermemHost):
    """Records what the agent tells it the declaration asks of the costly sources."""

    scopes: list[ObserveScope] = field(default_factory=list)

    def set_scope(self, scope: ObserveScope) -> None:
        self.scopes.append(scope)


async def test_the_host_is_told_what_the_declaration_asks_at_each_load(rig: RigFactory) -> None:
    host = ScopedHost(error=None)
    r = rig(peermem_config("auto"), host=host)  # type: ignore[arg-type]
    await r.start()
    assert host.scopes == [ObserveScope(modules=frozenset(), peermem="auto")]
    # An rxe link declared on reload: rdma_rxe's availability is asked from then on.
    r.cfg.desired = validate(
        Desired, {"rxe": [{"name": "rxe0", "netdev": {"name": "eth0"}}], "daemon": {}}
    )
    r.agent.request_reload()
    await r.idle()
    assert host.scopes[-1] == ObserveScope(modules=frozenset({"rdma_rxe"}), peermem="off")
    # A config that does not load keeps the last good one, and what it asks.
    r.cfg.errors = ["bad"]
    r.agent.request_reload()
    await r.idle()
    assert host.scopes[-1] == ObserveScope(modules=frozenset({"rdma_rxe"}), peermem="off")
    await r.stop()
