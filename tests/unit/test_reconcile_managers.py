"""Another network manager declares SR-IOV for a PF: the plan holds every write to it
(blocked, naming the manager and its file), not converged but explained, unless the
config gives the PF to rdmad (``owner = "rdmad"``)."""

from __future__ import annotations

from rdmad.managers import Claim, PfManagers
from rdmad.model import Blocked, Note, ObjectState, Observed, PlanState, SetNumVfs, summarize
from rdmad.reconcile import declared_objects, plan
from rdmad.reconcile.detail.sriov import sriov_detail
from rdmad.reconcile.resolve import resolve
from tests.support.records import replace
from tests.unit.test_reconcile import PF, desired, node, pf, sriov

LINK = Claim(
    "systemd-udevd",
    "/etc/systemd/network/10-pf.link",
    "SR-IOVVirtualFunctions=4; [SR-IOV] VirtualFunction=0",
)
UNKNOWN = PfManagers(unknown=("cannot list /etc/systemd/network: Permission denied",))
DECLARED = sriov(4, {"index": 0, "trust": True, "driver": "vfio-pci"})


def claimed(seen: PfManagers, numvfs: int = 0) -> Observed:
    return node(replace(pf(numvfs=numvfs), managers=seen))


def test_a_pf_another_manager_declares_is_held_with_nothing_written() -> None:
    d = desired(sriov=[{**DECLARED, "autoprobe": False, "eswitch": {"mode": "switchdev"}}])
    actions = plan(d, claimed(PfManagers((LINK,))), PlanState())
    assert [a.changes_kernel for a in actions] == [False]
    (held,) = actions
    assert isinstance(held, Blocked)
    assert held.reason == (
        "held: systemd-udevd declares SR-IOV for this PF in /etc/systemd/network/10-pf.link "
        "(SR-IOVVirtualFunctions=4; [SR-IOV] VirtualFunction=0); "
        'set owner = "rdmad" in its [[sriov]] to take it over'
    )
    (status,) = summarize(declared_objects(d), actions)
    assert status.state is ObjectState.BLOCKED and status.message == held.reason
    # VF settings that differ on VFs that exist are not rewritten either.
    actions = plan(d, claimed(PfManagers((LINK,)), numvfs=4), PlanState())
    assert [type(a) for a in actions] == [Blocked]


def test_without_a_claim_the_same_declaration_is_planned() -> None:
    d = desired(sriov=[DECLARED])
    actions = plan(d, claimed(PfManagers()), PlanState())
    assert any(isinstance(a, SetNumVfs) for a in actions)


def test_an_unknown_answer_holds_the_pf_and_says_why() -> None:
    d = desired(sriov=[DECLARED])
    (held,) = plan(d, claimed(UNKNOWN), PlanState())
    assert isinstance(held, Blocked)
    assert "whether another manager declares SR-IOV for it is unknown: cannot list " in held.reason


def test_a_claim_that_may_apply_holds_the_pf_and_says_why() -> None:
    maybe = replace(LINK, certain=False, why="[Match] Host=node1: not evaluated")
    (held,) = plan(desired(sriov=[DECLARED]), claimed(PfManagers((maybe,))), PlanState())
    assert "may declare SR-IOV" in held.reason and "Host=node1" in held.reason


def test_owner_rdmad_takes_the_pf_over_with_a_note() -> None:
    d = desired(sriov=[{**DECLARED, "owner": "rdmad"}])
    actions = plan(d, claimed(PfManagers((LINK,))), PlanState())
    assert isinstance(actions[0], Note)
    assert actions[0].reason.startswith('owner = "rdmad" overrides: systemd-udevd declares')
    assert any(isinstance(a, SetNumVfs) and a.new == 4 for a in actions)
    # Once converged, the object is converged and the note is its message.
    plain = desired(sriov=[{"pf": {"pci": PF}, "numvfs": 4, "owner": "rdmad"}])
    done = plan(plain, claimed(UNKNOWN, numvfs=4), PlanState())
    assert [type(a) for a in done] == [Note]
    (status,) = summarize(declared_objects(plain), done)
    assert status.state is ObjectState.CONVERGED and "overrides" in status.message


def test_status_detail_shows_the_owner_and_the_claims() -> None:
    d = desired(sriov=[DECLARED])
    observed = claimed(PfManagers((LINK,)))
    actions = plan(d, observed, PlanState())
    detail = sriov_detail(resolve(d, observed).targets[0], observed, actions).to_json()
    assert detail["desired"]["owner"] is None
    assert detail["observed"]["managers"] == {
        "claims": [
            {
                "manager": "systemd-udevd",
                "file": "/etc/systemd/network/10-pf.link",
                "what": "SR-IOVVirtualFunctions=4; [SR-IOV] VirtualFunction=0",
                "certain": True,
                "why": "",
            }
        ],
        "unknown": [],
    }
    numvfs = next(a for a in detail["attributes"] if a["name"] == "numvfs")
    assert numvfs["state"] == "blocked" and numvfs["reason"].startswith("held: ")
