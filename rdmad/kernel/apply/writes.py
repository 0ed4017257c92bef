"""The one describer: the kernel writes an action stands for, in the order they run.

``planned_writes(action, sysfs)`` is used by the real host (which executes each
write and records it) and by the dry-run recorder (which only records it), so a
dry run, the log and the history describe an action identically. Each write
carries the ``(target, old, new)`` changes it makes; ``old`` is what the planner
saw, and a destructive write is re-checked against the kernel right before it
runs (``KernelHost``): if the kernel no longer matches, the action is stale.
"""

from __future__ import annotations

import enum

import msgspec

from rdmad.kernel.guardhook import HOOK_FILE
from rdmad.kernel.ibcore import OPTIONS_FILE
from rdmad.kernel.sysfs import PCI_DEVICES, Sysfs
from rdmad.model import (
    NO_DRIVER,
    Action,
    AddRxe,
    BindVfDriver,
    DeleteRxe,
    LoadModule,
    SetAutoprobe,
    SetEswitch,
    SetIbVf,
    SetLinkUp,
    SetNumVfs,
    SetRdmaNetnsMode,
    SetVfSettings,
    SyncGuardHook,
    SyncIbCoreOptions,
    SyncOpenibdDropin,
)
from rdmad.openibd import DROPIN as OPENIBD_DROPIN

Change = tuple[str, object, object]  # (target, old, new) of one change

IB_VF_FILES = {"node_guid": "node", "port_guid": "port", "policy": "policy"}


class Op(enum.Enum):
    NUMVFS = "numvfs"  # write sriov_numvfs (slow: off the loop, with a deadline)
    SYSFS = "sysfs"  # write ``value`` to ``path``
    UNBIND = "unbind"  # write the device to drivers/<arg>/unbind
    PROBE = "probe"  # drivers_probe, then wait for driver ``value`` ("" = any or none)
    MODPROBE = "modprobe"
    LINK_UP = "link-up"
    VF_SETTINGS = "vf-settings"  # one batched RTM_SETLINK, one change per VF attribute
    RXE_ADD = "rxe-add"
    RXE_DEL = "rxe-del"
    GUARD_HOOK = "guard-hook"  # write (or remove) the modprobe.d guard file, atomically
    # write (``value`` "write") or remove openibd.service's drop-in, then daemon-reload
    OPENIBD_DROPIN = "openibd-dropin"
    ESWITCH = "eswitch"  # devlink eswitch set: ``value`` is "option=new" for the PF ``path``
    RDMA_NETNS = "rdma-netns"  # nldev SYS_SET: the RDMA subsystem's netns mode
    IBCORE_OPTIONS = "ib-core-options"  # write (or remove) rdmad's ib_core modprobe.d option


class PlannedWrite(msgspec.Struct, frozen=True):
    op: Op
    changes: tuple[Change, ...]
    path: str = ""  # sysfs path (relative to the root) or a driver / module / link name
    value: str = ""
    destructive: bool = False  # destroys or detaches something: re-checked before it runs
    needs_previous: bool = False  # runs only if every earlier write of the action succeeded

    @property
    def brings_back(self) -> bool:
        """Loads a module, creates an rxe link or sends an RDMA netlink request (which
        makes the kernel load ib_core): never while a guarded stop is in progress."""
        return self.op in (Op.MODPROBE, Op.RXE_ADD, Op.RDMA_NETNS)


def planned_writes(action: Action, sysfs: Sysfs) -> list[PlannedWrite]:
    """The writes ``action`` stands for; [] for actions that change nothing."""
    if isinstance(action, SetNumVfs):
        rel = f"{sysfs.device_dir(action.pci)}/sriov_numvfs"
        change: Change = (f"{action.pci} sriov_numvfs", action.old, action.new)
        # Any write to a non-zero count destroys every VF first.
        return [PlannedWrite(Op.NUMVFS, (change,), rel, str(action.new), action.old > 0)]
    if isinstance(action, SetAutoprobe):
        rel = f"{sysfs.device_dir(action.pci)}/sriov_drivers_autoprobe"
        change = (f"{action.pci} sriov_drivers_autoprobe", int(action.old), int(action.new))
        return [PlannedWrite(Op.SYSFS, (change,), rel, str(int(action.new)))]
    if isinstance(action, SetEswitch):
        # One request per option, mode first: a driver that refuses one option (EOPNOTSUPP)
        # must not hide that the others were set. A mode change re-creates the vports of
        # the VFs that exist then (some may have been made since the plan): destructive,
        # re-checked against their use right before.
        return [
            PlannedWrite(
                Op.ESWITCH,
                ((f"{action.pci} eswitch {option}", old, new),),
                action.pci,
                f"{option}={new}",
                destructive=option == "mode",
            )
            for option, old, new in action.changes
        ]
    if isinstance(action, SetLinkUp):
        return [PlannedWrite(Op.LINK_UP, ((f"{action.netdev} link", "down", "up"),), action.netdev)]
    if isinstance(action, SetVfSettings):
        changes = tuple(
            (f"{action.pf_netdev} vf {c.vf} {c.attr}", c.old, c.new) for c in action.changes
        )
        return [PlannedWrite(Op.VF_SETTINGS, changes, action.pf_netdev)]
    if isinstance(action, SetIbVf):
        return _ib_vf(action, sysfs)
    if isinstance(action, BindVfDriver):
        return _bind(action)
    if isinstance(action, LoadModule):
        return [_modprobe(action.module)]
    if isinstance(action, SyncGuardHook):
        change = (
            f"/{HOOK_FILE}",
            ", ".join(action.old) or None,
            ", ".join(action.modules) or None,
        )
        return [PlannedWrite(Op.GUARD_HOOK, (change,), HOOK_FILE, " ".join(action.modules))]
    if isinstance(action, SyncOpenibdDropin):
        state = "ExecStop= guarded"
        change = (
            f"/{OPENIBD_DROPIN}",
            None if action.write else state,
            state if action.write else None,
        )
        return [
            PlannedWrite(
                Op.OPENIBD_DROPIN, (change,), OPENIBD_DROPIN, "write" if action.write else ""
            )
        ]
    if isinstance(action, SetRdmaNetnsMode):
        change = ("rdma system netns", action.old, action.new)
        return [PlannedWrite(Op.RDMA_NETNS, (change,), "netns", action.new)]
    if isinstance(action, SyncIbCoreOptions):
        change = (f"/{OPTIONS_FILE} netns_mode", action.old, action.mode)
        return [PlannedWrite(Op.IBCORE_OPTIONS, (change,), OPTIONS_FILE, action.mode or "")]
    if isinstance(action, AddRxe):
        change = (f"rdma link {action.name}", None, f"rxe on {action.netdev}")
        return [PlannedWrite(Op.RXE_ADD, (change,), action.name, action.netdev)]
    if isinstance(action, DeleteRxe):
        was = f"rxe on {action.netdev}" if action.netdev else "present"
        change = (f"rdma link {action.name}", was, None)
        return [PlannedWrite(Op.RXE_DEL, (change,), action.name, destructive=True)]
    return []


def _modprobe(module: str) -> PlannedWrite:
    return PlannedWrite(Op.MODPROBE, ((f"module {module}", "not loaded", "loaded"),), module)


def _unbind(pci: str, driver: str) -> PlannedWrite:
    change: Change = (f"{pci} driver", driver, None)
    return PlannedWrite(Op.UNBIND, (change,), driver, pci, destructive=True, needs_previous=True)


def _probe(pci: str, expect: str | None) -> PlannedWrite:
    change: Change = (f"{pci} driver", None, expect)
    return PlannedWrite(Op.PROBE, (change,), pci, expect or "", needs_previous=True)


def _ib_vf(action: SetIbVf, sysfs: Sysfs) -> list[PlannedWrite]:
    out = []
    for c in action.changes:
        rel = f"{sysfs.ib_vf_dir(action.ib_device, action.vf)}/{IB_VF_FILES.get(c.attr, c.attr)}"
        change = (f"{action.ib_device} vf {action.vf} {c.attr}", c.old, c.new)
        out.append(PlannedWrite(Op.SYSFS, (change,), rel, str(c.new)))
    if action.rebind and action.vf_pci:
        if action.vf_driver is not None:
            out.append(_unbind(action.vf_pci, action.vf_driver))
        out.append(_probe(action.vf_pci, action.vf_driver))
    return out


def _bind(action: BindVfDriver) -> list[PlannedWrite]:
    """driver_override first (so nothing else grabs the VF), then unbind, then probe.

    ``driver = "none"`` writes an override no driver matches: the VF stays unbound,
    also when the PF driver re-probes its VFs.
    """
    pci, new = action.vf_pci, action.new
    out = []
    if action.load_module and new != NO_DRIVER:
        out.append(_modprobe(new))
    if action.override_old != new:
        rel = f"{PCI_DEVICES}/{pci}/driver_override"
        override: Change = (f"{pci} driver_override", action.override_old, new)
        out.append(PlannedWrite(Op.SYSFS, (override,), rel, new, needs_previous=True))
    if action.old is not None:
        out.append(_unbind(pci, action.old))
    if new != NO_DRIVER:
        out.append(_probe(pci, new))
    return out
