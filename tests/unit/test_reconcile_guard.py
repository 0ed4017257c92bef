"""plan()'s guard rules: the modprobe.d hook follows the config; a pause holds back loads."""

from __future__ import annotations

import msgspec

from rdmad.model import (
    Action,
    AddRxe,
    BindVfDriver,
    Desired,
    GuardHookObserved,
    LoadModule,
    ModulesObserved,
    NetdevObserved,
    Note,
    Observed,
    OpenibdObserved,
    PauseObserved,
    PfObserved,
    PlanState,
    SetNumVfs,
    SyncGuardHook,
    SyncOpenibdDropin,
    Waiting,
)
from rdmad.model.validation import validate
from rdmad.reconcile import plan
from rdmad.reconcile.detail.sriov import guard_state
from tests.support.records import replace

PF = "0000:3b:00.0"


def desired(**doc: object) -> Desired:
    return validate(Desired, doc)


def node(
    hook: GuardHookObserved | None,
    *,
    driver: str | None = "igb",
    module: str | None = "igb",
    numvfs: int = 2,
    pause: PauseObserved | None = None,
    loaded: frozenset[str] = frozenset({"igb"}),
) -> Observed:
    pf = PfObserved(
        pci=PF,
        driver=driver,
        netdev="ens1f0",
        ifindex=3,
        mac="52:54:00:00:00:01",
        perm_mac=None,
        numvfs=numvfs,
        totalvfs=7,
        driver_module=module,
    )
    return Observed(
        netdevs=(NetdevObserved("ens1f0", 3), NetdevObserved("eth0", 2)),
        pfs=(pf,),
        modules=ModulesObserved(loaded),
        guard_hook=hook,
        pause=pause,
    )


SRIOV = {"sriov": [{"pf": {"pci": PF}, "numvfs": 2}]}
ABSENT = GuardHookObserved()


def hook_actions(d: Desired, o: Observed) -> list[SyncGuardHook]:
    return [a for a in plan(d, o, PlanState()) if isinstance(a, SyncGuardHook)]


def test_guarded_pf_gets_its_driver_module_hooked_once() -> None:
    [sync] = hook_actions(desired(**SRIOV), node(ABSENT))
    assert sync.modules == ("igb",) and sync.old == ()
    installed = GuardHookObserved(frozenset({"igb"}), current=True, present=True)
    assert hook_actions(desired(**SRIOV), node(installed)) == []  # idempotent
    stale = replace(installed, current=False)  # another rdmad's command
    assert hook_actions(desired(**SRIOV), node(stale))[0].modules == ("igb",)


def test_driver_guard_false_or_nothing_declared_removes_the_hook() -> None:
    installed = GuardHookObserved(frozenset({"igb"}), current=True, present=True)
    off = desired(sriov=[{"pf": {"pci": PF}, "numvfs": 2, "driver_guard": False}])
    [sync] = hook_actions(off, node(installed))
    assert sync.modules == () and sync.old == ("igb",)
    assert sync.describe() == "remove the modprobe.d guard hook"
    assert hook_actions(off, node(ABSENT)) == []  # nothing there, nothing to remove
    assert hook_actions(desired(), node(installed))[0].modules == ()


def test_rxe_links_hook_rdma_rxe_and_a_builtin_driver_needs_no_hook() -> None:
    d = desired(rxe=[{"name": "rxe0", "netdev": {"name": "eth0"}}], **SRIOV)
    [sync] = hook_actions(d, node(ABSENT, module=None))  # igb built in
    assert sync.modules == ("rdma_rxe",)


def test_an_unknown_driver_never_drops_a_guard() -> None:
    """The PF's driver is unloaded (or the PF is gone): keep what the file guards."""
    installed = GuardHookObserved(frozenset({"igb"}), current=True, present=True)
    assert hook_actions(desired(**SRIOV), node(installed, driver=None, module=None)) == []
    gone = replace(node(installed), pfs=())
    assert hook_actions(desired(**SRIOV), gone) == []


def test_an_unobserved_hook_plans_nothing() -> None:
    assert hook_actions(desired(**SRIOV), node(None)) == []


def test_a_pause_holds_back_module_loads_and_rxe_creation_only() -> None:
    pause = PauseObserved("`modprobe -r igb` (modprobe (pid 7), uid 0)", "guarded stop", 0, 120)
    d = desired(
        rxe=[{"name": "rxe0", "netdev": {"name": "eth0"}}],
        sriov=[{"pf": {"pci": PF}, "numvfs": 4}],
    )
    o = node(GuardHookObserved(frozenset({"igb", "rdma_rxe"}), True, True), numvfs=0, pause=pause)
    actions = plan(d, o, PlanState())
    assert not [a for a in actions if isinstance(a, LoadModule | AddRxe)]
    held = [a for a in actions if isinstance(a, Waiting) and "held back" in a.reason]
    assert [a.obj for a in held] == ["rxe rxe0", "rxe rxe0"]  # modprobe rdma_rxe, then the link
    assert "paused by `modprobe -r igb`" in held[0].reason
    assert any(isinstance(a, SetNumVfs) for a in actions)  # VF counts go on
    unpaused = plan(d, replace(o, pause=None), PlanState())
    assert [type(a) for a in unpaused if isinstance(a, LoadModule | AddRxe)] == [
        LoadModule,
        AddRxe,
    ]


def test_a_bind_that_loads_a_module_waits_too() -> None:
    from rdmad.reconcile.guard import stand_back

    pause = PauseObserved("x", "y", 0, 10)
    bind = BindVfDriver("sriov", "r", vf_pci="0000:3b:00.2", new="vfio-pci", load_module=True)
    plain = msgspec.structs.replace(bind, load_module=False)
    o = replace(node(ABSENT), pause=pause)
    out = stand_back([bind, plain], o)
    assert isinstance(out[0], Waiting) and out[1] is plain


def test_status_says_whether_the_guard_is_installed_per_pf() -> None:
    spec = desired(**SRIOV).sriov[0]
    installed = GuardHookObserved(frozenset({"igb"}), current=True, present=True)
    o = node(installed)
    assert guard_state(spec, o.pfs[0], o) == "installed (modprobe -r igb asks the guard)"
    o = node(ABSENT)
    assert guard_state(spec, o.pfs[0], o) == "not installed yet for igb"
    o = node(ABSENT, module=None)
    assert guard_state(spec, o.pfs[0], o).startswith("not needed (igb is built in")
    off = desired(sriov=[{"pf": {"pci": PF}, "numvfs": 2, "driver_guard": False}]).sriov[0]
    assert guard_state(off, o.pfs[0], o) == "off (driver_guard = false)"


# --- openibd.service's drop-in -----------------------------------------------------------

OPENIBD = OpenibdObserved(unit=True)


def openibd_actions(d: Desired, hook: GuardHookObserved) -> list[Action]:
    return [
        a
        for a in plan(d, node(hook), PlanState())
        if isinstance(a, SyncOpenibdDropin) or (isinstance(a, Note) and a.obj == "guard")
    ]


def test_openibd_gets_the_drop_in_only_while_something_is_guarded() -> None:
    hooked = GuardHookObserved(frozenset({"igb"}), current=True, present=True, openibd=OPENIBD)
    [write] = openibd_actions(desired(**SRIOV), hooked)
    assert isinstance(write, SyncOpenibdDropin) and write.write
    current = replace(OPENIBD, dropin="current")
    assert openibd_actions(desired(**SRIOV), replace(hooked, openibd=current)) == []
    stale = replace(OPENIBD, dropin="stale")  # the unit's ExecStop= changed
    [rewrite] = openibd_actions(desired(**SRIOV), replace(hooked, openibd=stale))
    assert isinstance(rewrite, SyncOpenibdDropin) and rewrite.write
    # The empty config: no guard, so no drop-in; one left from before is removed.
    assert openibd_actions(desired(), GuardHookObserved(openibd=OPENIBD)) == []
    [remove] = openibd_actions(desired(), GuardHookObserved(openibd=current))
    assert isinstance(remove, SyncOpenibdDropin) and not remove.write
    # No openibd.service on the node: nothing, guarded or not.
    assert openibd_actions(desired(**SRIOV), replace(hooked, openibd=ABSENT.openibd)) == []


def test_openibd_whose_stop_cannot_be_known_gets_no_drop_in_and_a_note() -> None:
    unknown = OpenibdObserved(
        unit=True, unknown="/etc/systemd/system/openibd.service could not be read", dropin="stale"
    )
    hooked = GuardHookObserved(frozenset({"igb"}), current=True, present=True, openibd=unknown)
    note, remove = openibd_actions(desired(**SRIOV), hooked)
    assert isinstance(note, Note) and "cannot be known" in note.reason
    assert isinstance(remove, SyncOpenibdDropin) and not remove.write
