"""Actions: one kernel change each, with the object it belongs to and a reason a human
can read. ``Blocked``, ``Waiting`` and the per-VF notes change nothing; they say why an
object is not converged."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from rdmad.peermem.names import canonical

# --- actions ----------------------------------------------------------------------------


class Action(msgspec.Struct, frozen=True):
    """One step of a plan. ``obj`` names the declared object, e.g. 'sriov 0000:3b:00.0'."""

    obj: str
    reason: str
    kind: ClassVar[str] = "action"
    changes_kernel: ClassVar[bool] = True

    def describe(self) -> str:
        raise NotImplementedError


class SetNumVfs(Action, frozen=True):
    pci: str = ""
    old: int = 0
    new: int = 0
    kind: ClassVar[str] = "set-numvfs"

    def describe(self) -> str:
        return f"{self.pci}: sriov_numvfs {self.old} -> {self.new}"


class SetEswitch(Action, frozen=True):
    """A PF's eSwitch (`devlink dev eswitch set`): the options that differ, each as
    (option, old, new) with option "mode", "inline_mode" or "encap_mode". Planned before
    the VFs are made; a mode change while VFs exist re-creates their vports, so it is
    planned only while they are free and re-checked right before it is sent."""

    pci: str = ""
    changes: tuple[tuple[str, str | None, str], ...] = ()
    numvfs: int = 0  # the VFs the PF had when this was planned
    kind: ClassVar[str] = "set-eswitch"

    def describe(self) -> str:
        said = ", ".join(f"{o} {old or 'unset'} -> {new}" for o, old, new in self.changes)
        return f"{self.pci}: eswitch {said}"


class SetAutoprobe(Action, frozen=True):
    """sriov_drivers_autoprobe of a PF: whether VFs it creates get a driver on their own.
    Written before the VFs are created; VFs that exist keep the driver they have."""

    pci: str = ""
    old: bool = True
    new: bool = True
    kind: ClassVar[str] = "set-autoprobe"

    def describe(self) -> str:
        return f"{self.pci}: sriov_drivers_autoprobe {int(self.old)} -> {int(self.new)}"


class SetLinkUp(Action, frozen=True):
    """Bring a PF netdev up: some drivers create VFs only while the PF is up."""

    netdev: str = ""
    kind: ClassVar[str] = "set-link-up"

    def describe(self) -> str:
        return f"ip link set {self.netdev} up"


class VfChange(msgspec.Struct, frozen=True):
    vf: int
    attr: str  # a VfSettings field name
    old: object
    new: object


class SetVfSettings(Action, frozen=True):
    """Per-VF rtnetlink settings of one PF, meant to go out as one batched message."""

    pci: str = ""
    pf_netdev: str = ""
    pf_ifindex: int | None = None  # the PF is addressed by ifindex: names can change
    changes: tuple[VfChange, ...] = ()
    kind: ClassVar[str] = "set-vf"

    def describe(self) -> str:
        parts = [
            f"vf {c.vf} {c.attr} {format_value(c.old)} -> {format_value(c.new)}"
            for c in self.changes
        ]
        return f"{self.pf_netdev} ({self.pci}): " + ", ".join(parts)


class SetIbVf(Action, frozen=True):
    """Write IB node/port GUID and policy; they take effect after the VF is re-bound."""

    pci: str = ""
    ib_device: str = ""
    vf: int = 0
    vf_pci: str = ""
    changes: tuple[VfChange, ...] = ()
    rebind: bool = False  # unbind + bind the VF so new GUIDs take effect
    vf_driver: str | None = None  # the VF's driver when planned (what the rebind unbinds)
    kind: ClassVar[str] = "set-ib-vf"

    def describe(self) -> str:
        parts = [f"{c.attr} {format_value(c.old)} -> {format_value(c.new)}" for c in self.changes]
        then = f", then rebind {self.vf_pci}" if self.rebind else ""
        return f"{self.ib_device} vf {self.vf}: " + ", ".join(parts) + then


class BindVfDriver(Action, frozen=True):
    """Bind a VF to ``new`` (or keep it unbound when ``new`` is NO_DRIVER) via driver_override."""

    vf_pci: str = ""
    old: str | None = None  # the VF's driver when planned
    new: str = ""
    override_old: str | None = None  # driver_override when planned
    load_module: bool = False  # the driver's module was not loaded when planned
    kind: ClassVar[str] = "bind-vf"

    def describe(self) -> str:
        return f"{self.vf_pci}: driver {format_value(self.old)} -> {self.new}"


class LoadModule(Action, frozen=True):
    """``modprobe module``. ``requires``: modules that must still be loaded when it runs,
    else it is stale: modprobe loads dependencies, so a load planned before an RDMA
    stack stop would otherwise bring back the ib_core the operator just removed."""

    module: str = ""
    requires: tuple[str, ...] = ()
    kind: ClassVar[str] = "load-module"

    def describe(self) -> str:
        return f"modprobe {self.module}"


class SyncGuardHook(Action, frozen=True):
    """Make rdmad's modprobe.d guard file guard exactly ``modules`` (none: remove it)."""

    modules: tuple[str, ...] = ()
    old: tuple[str, ...] = ()
    kind: ClassVar[str] = "sync-guard-hook"

    def describe(self) -> str:
        if not self.modules:
            return "remove the modprobe.d guard hook"
        return f"guard `modprobe -r` of {', '.join(self.modules)} (modprobe.d hook)"


class SyncOpenibdDropin(Action, frozen=True):
    """Write rdmad's drop-in for openibd.service from the unit's own ExecStop= lines as
    they read when it is applied (``write``), or remove it; systemd is told to reload."""

    write: bool = True
    kind: ClassVar[str] = "sync-openibd-dropin"

    def describe(self) -> str:
        if not self.write:
            return "remove the openibd.service guard drop-in"
        return "openibd.service stop asks the guard first (drop-in)"


class SetRdmaNetnsMode(Action, frozen=True):
    """``rdma system set netns NEW``: the kernel accepts it only while no network
    namespace but the host's exists."""

    old: str = ""
    new: str = ""
    kind: ClassVar[str] = "set-rdma-netns"

    def describe(self) -> str:
        return f"rdma system set netns {self.new} (was {self.old})"


class SyncIbCoreOptions(Action, frozen=True):
    """Make rdmad's modprobe.d file give ib_core ``mode`` at its next load (None: remove it)."""

    mode: str | None = None
    old: str | None = None
    kind: ClassVar[str] = "sync-ib-core-options"

    def describe(self) -> str:
        if self.mode is None:
            return "remove the modprobe.d ib_core netns_mode option"
        return f"ib_core loads in netns mode {self.mode} (modprobe.d option)"


class AddRxe(Action, frozen=True):
    name: str = ""
    netdev: str = ""
    kind: ClassVar[str] = "add-rxe"

    def describe(self) -> str:
        return f"rdma link add {self.name} type rxe netdev {self.netdev}"


class DeleteRxe(Action, frozen=True):
    name: str = ""
    netdev: str | None = None  # where the link was when planned
    kind: ClassVar[str] = "delete-rxe"

    def describe(self) -> str:
        return f"rdma link delete {self.name}"


class Blocked(Action, frozen=True):
    """Something must not or cannot be done; says why and who holds it.

    ``vfs``: the VFs it is about (a VF in use, a VF that cannot be re-bound), so status
    can point at them without reading the reason; empty when it is about the object.
    """

    vfs: tuple[int, ...] = ()
    kind: ClassVar[str] = "blocked"
    changes_kernel: ClassVar[bool] = False

    def describe(self) -> str:
        return f"blocked: {self.reason}"


class Waiting(Action, frozen=True):
    """Nothing to do yet: the kernel has not shown what the object needs.

    ``vfs``: the VFs it waits for (not appeared, settings unreadable); empty when it is
    about the object.
    """

    vfs: tuple[int, ...] = ()
    kind: ClassVar[str] = "waiting"
    changes_kernel: ClassVar[bool] = False

    def describe(self) -> str:
        return f"waiting: {self.reason}"


class NotServing(Waiting, frozen=True):
    """An rxe link present as declared that cannot carry traffic yet: its port is not
    ACTIVE, or it has no GID made from an IP address (what rdma_cm and routed RoCE v2
    address it by). Restored but not working, so not converged.

    ``recheck``: seconds after which to look again without an event. The kernel fills
    a device's GIDs from a work queue after it is created or its netdev gets an
    address, and says nothing when it is done.
    """

    recheck: float = 0.0
    netdev_ifindex: int | None = None  # the netdev whose addresses its GIDs come from
    kind: ClassVar[str] = "not-serving"


class Degraded(Action, frozen=True):
    """An object that is required and cannot be brought up now; says why.

    Unlike a failed action (retried with backoff), nothing is retried: what it
    needs must change first (e.g. ``[peermem] mode = "require"`` and no module).
    """

    kind: ClassVar[str] = "degraded"
    changes_kernel: ClassVar[bool] = False

    def describe(self) -> str:
        return f"degraded: {self.reason}"


class Note(Action, frozen=True):
    """Something worth saying about an object that is converged (e.g. peermem loaded)."""

    kind: ClassVar[str] = "note"
    changes_kernel: ClassVar[bool] = False

    def describe(self) -> str:
        return f"note: {self.reason}"


class _VfNote(Action, frozen=True):
    """A note about one VF attribute that leaves the rest of the object converged."""

    vf: int = 0
    attr: str = ""
    changes_kernel: ClassVar[bool] = False
    label: ClassVar[str] = ""

    def describe(self) -> str:
        return f"{self.label}: {self.reason}"


# The ``vf`` of a note about the PF itself (its eSwitch), not one of its VFs.
PF_ATTR = -1


class Unsupported(_VfNote, frozen=True):
    """A VF attribute the PF's driver refused: reported, not retried (see PlanState)."""

    kind: ClassVar[str] = "unsupported"
    label: ClassVar[str] = "unsupported"


class InUseDrift(_VfNote, frozen=True):
    """A VF in use differs from its declaration; left alone unless in_use_drift = "apply"."""

    kind: ClassVar[str] = "drift-in-use"
    label: ClassVar[str] = "drift on in-use VF"


def action_touches(action: Action) -> frozenset[str]:
    """Names an action depends on: netdev, RDMA and module names, PCI addresses,
    "ifindex:N".

    An event that renames or removes one of them makes the action stale (the agent
    re-observes before applying it); events about anything else leave it alone.
    """
    names: set[str | None] = set()
    if isinstance(action, SetNumVfs | SetAutoprobe | SetEswitch):
        names = {action.pci}
    elif isinstance(action, SetLinkUp):
        names = {action.netdev}
    elif isinstance(action, SetVfSettings):
        names = {action.pci, action.pf_netdev}
        if action.pf_ifindex is not None:
            names.add(f"ifindex:{action.pf_ifindex}")
    elif isinstance(action, SetIbVf):
        names = {action.pci, action.ib_device, action.vf_pci}
    elif isinstance(action, BindVfDriver):
        names = {action.vf_pci}
    elif isinstance(action, AddRxe | DeleteRxe):
        names = {action.name, action.netdev}
    elif isinstance(action, SetRdmaNetnsMode):
        names = {"ib_core"}  # unloaded meanwhile: the next load reads the modprobe.d option
    elif isinstance(action, LoadModule):
        # As /sys/module and module uevents name them: a module that went away (an RDMA
        # stack restart) or one it needs coming back makes the same load a new one.
        names = {canonical(action.module), *action.requires}
    return frozenset(n for n in names if n)


def format_value(value: object) -> str:
    """How a setting reads in plans and logs: None is 'unset', booleans are on/off."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
