"""The agent and [[sriov]] eswitch: an option the driver refuses as unsupported is
reported and not sent again; a mode change refused while VFs exist (ice answers
EOPNOTSUPP then) is a failure that is retried, never remembered as unsupported; a mode
change is never sent while a VF or its representor is in use (the simulated kernel
records the harm it would do)."""

from __future__ import annotations

import errno

import msgspec
import pytest

from rdmad.model import Action, Desired, EswitchObserved, SetEswitch, Usage, Use
from rdmad.model.validation import validate
from tests.agent.conftest import FakeResult, FakeWrite, RigFactory
from tests.agent.test_safety import PF, SimHost, igb_like
from tests.support.records import replace
from tests.support.simkernel import SimKernel


class EswitchHost(SimHost):
    """Answers each eSwitch option on its own, as the real host does (one request each);
    ``refuse`` maps an option to the errno the driver answers it with."""

    async def apply(self, action: Action) -> FakeResult:
        if not isinstance(action, SetEswitch):
            return await super().apply(action)
        self.applied.append(action)
        writes, kept = [], []
        for option, old, new in action.changes:
            self.attempts.append((-1, option, new))
            code = self.refuse.get(option)
            error = None if code is None else OSError(code, "refused")
            writes.append(FakeWrite(f"{PF} eswitch {option}", old, new, error))
            if code is None:
                kept.append((option, old, new))
        if kept:
            self.kernel.apply(msgspec.structs.replace(action, changes=tuple(kept)))
        return FakeResult(tuple(writes))


def node(numvfs: int) -> SimKernel:
    o = igb_like(numvfs)
    pf = replace(o.pfs[0], driver="ice", eswitch=EswitchObserved("legacy", "none"))
    return SimKernel(replace(o, pfs=(pf,)))


def declared(numvfs: int) -> Desired:
    eswitch = {"mode": "switchdev", "inline_mode": "transport"}
    return validate(
        Desired,
        {
            "daemon": {"drift_interval": "1m"},
            "sriov": [{"pf": {"pci": PF}, "numvfs": numvfs, "eswitch": eswitch}],
        },
    )


async def test_a_refused_option_is_unsupported_and_not_sent_again(rig: RigFactory) -> None:
    host = EswitchHost(node(0), refuse={"inline_mode": errno.EOPNOTSUPP})
    r = rig(declared(2), host=host, startup_timeout=1000.0)
    await r.start()
    await r.idle()
    await r.advance(300.0, step=20.0)  # several drift passes
    await r.idle()
    assert host.attempts.count((-1, "inline_mode", "transport")) == 1, host.attempts
    assert host.attempts.count((-1, "mode", "switchdev")) == 1
    pf = host.kernel.observed.pfs[0]
    assert pf.eswitch is not None and pf.eswitch.mode == "switchdev" and pf.numvfs == 2
    [report] = r.agent.status.current.objects
    assert report.state.value == "unsupported-by-driver", report
    assert "eswitch inline_mode = transport" in report.message
    await r.stop()


async def test_a_mode_change_refused_while_vfs_exist_is_retried_not_remembered(
    rig: RigFactory,
) -> None:
    host = EswitchHost(node(2), refuse={"mode": errno.EOPNOTSUPP})
    r = rig(declared(2), host=host, startup_timeout=1000.0)
    await r.start()
    await r.idle()
    await r.advance(300.0, step=20.0)
    await r.idle()
    assert host.attempts.count((-1, "mode", "switchdev")) >= 2, host.attempts
    [report] = r.agent.status.current.objects
    assert report.state.value not in ("converged", "unsupported-by-driver"), report
    assert not host.kernel.hurt
    await r.stop()


@pytest.mark.parametrize("held", ["vf", "representor"])
async def test_no_mode_change_under_a_vf_or_representor_in_use(rig: RigFactory, held: str) -> None:
    kernel = node(2)
    pf = kernel.observed.pfs[0]
    user = Usage(Use.IN_USE, ("pid 77 (qemu-system-x86) holds /dev/vfio/12",))
    if held == "vf":
        vf1 = replace(pf.vfs[1], usage=user)
    else:
        user = Usage(Use.IN_USE, ("representor eth_rep1 is a port of ovs-system",))
        vf1 = replace(pf.vfs[1], representor="eth_rep1", representor_usage=user)
    pf = replace(pf, vfs=(pf.vfs[0], vf1))
    kernel.observed = replace(kernel.observed, pfs=(pf,))
    host = EswitchHost(kernel)
    r = rig(declared(2), host=host, startup_timeout=1000.0)
    await r.start()
    await r.idle()
    await r.advance(300.0, step=20.0)
    await r.idle()
    assert (-1, "mode", "switchdev") not in host.attempts, host.attempts
    assert not host.kernel.hurt
    [report] = r.agent.status.current.objects
    assert report.state.value == "blocked" and user.holders[0] in report.message, report
    await r.stop()
