"""While passes fail, every reader hears "degraded" and why, never the last good
"converged"; once a pass works again, converged comes back by itself."""

from __future__ import annotations

import errno

from rdmad.api import documents as docs
from rdmad.api.metrics import Metrics
from rdmad.model import NodeState, Observed
from tests.agent.conftest import FakeHost, RigFactory, desired, until
from tests.api.metricsutil import parse, value


class Starved(FakeHost):
    """A host whose observation fails with EMFILE (every fd taken by a flood of
    connections) for the next ``failing`` passes."""

    failing = 0
    failed = 0

    async def observe(self) -> Observed:
        if self.failing > 0:
            self.failing -= 1
            self.failed += 1
            raise OSError(errno.EMFILE, "Too many open files")
        return await super().observe()


async def test_emfile_passes_say_degraded_then_converged_again(rig: RigFactory) -> None:
    host = Starved()
    r = rig(desired(("rxe0", "eth0")), host=host)
    metrics = Metrics(r.agent.status)
    await r.start()
    await r.idle()
    assert r.agent.status.current.converged and host.links == {"rxe0": "eth0"}

    host.failing = 3
    r.agent.trigger("drift", "look again")
    await until(lambda: host.failing < 3, "a failing pass")
    await until(lambda: r.agent.status.current.pass_error is not None, "status of the failure")

    snap = r.agent.status.current
    verdict = snap.verdict()
    assert verdict.state is NodeState.DEGRADED
    assert "Too many open files" in verdict.reason, verdict
    doc = docs.status_doc(snap, docs.DaemonFacts(1, 0.0))
    assert doc["converged"] is False and doc["verdict"]["state"] == "degraded"
    assert "Too many open files" in doc["daemon"]["pass_error"]
    status_text = [n for n in r.notes.sent if n.startswith("STATUS=")][-1]
    assert status_text.startswith("STATUS=DEGRADED: passes fail: observing the kernel failed"), (
        status_text
    )
    assert "Too many open files" in status_text
    samples = parse(metrics.render())
    assert value(samples, "rdmad_converged") == 0.0
    assert value(samples, "rdmad_passes_failing") == 1.0

    # The retries (backoff 1 s, 2 s, 4 s) fail twice more, then observing works again.
    for _ in range(40):
        if host.failing == 0 and r.agent.status.current.pass_error is None:
            break
        if host.failing > 0:  # still failing: never converged meanwhile
            assert r.agent.status.current.verdict().state is NodeState.DEGRADED
        await r.advance(1.0, step=0.25)
    else:
        raise AssertionError(f"not recovered: {r.agent.status.current.summary()}")
    assert host.failed == 3
    await r.idle()
    snap = r.agent.status.current
    assert snap.converged and snap.verdict().state is NodeState.CONVERGED
    assert [n for n in r.notes.sent if n.startswith("STATUS=")][-1] == (
        "STATUS=1 object(s), 1 converged"
    )
    samples = parse(metrics.render())
    assert value(samples, "rdmad_converged") == 1.0
    assert value(samples, "rdmad_passes_failing") == 0.0
    await r.stop()


async def test_a_pass_whose_status_cannot_be_built_is_degraded(rig: RigFactory) -> None:
    """A bug while building the status (here a state entry of the wrong shape) must not
    leave the last good snapshot speaking for the node."""
    r = rig(desired(("rxe0", "eth0")))
    await r.start()
    await r.idle()
    assert r.agent.status.current.converged
    r.agent.state.applied["rxe rxe0"] = "x"  # type: ignore[assignment]
    passes = len(r.agent.passes)
    r.agent.trigger("drift", "look again")
    await until(lambda: len(r.agent.passes) > passes, "a pass")
    snap = r.agent.status.current
    assert not snap.converged
    assert snap.verdict().state is NodeState.DEGRADED
    assert "internal error building status" in (snap.pass_error or ""), snap
    assert snap.passes == len(r.agent.passes)
    await r.stop()
