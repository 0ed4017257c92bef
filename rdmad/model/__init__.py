"""The data rdmad reasons about: what is declared, what the kernel shows, what to do.

* ``values``: the value types of the config (MACs, GUIDs, PCI addresses, durations);
* ``desired``: ``Desired`` and its parts, pydantic models that are the config schema;
* ``observed``: ``Observed`` and its parts, frozen snapshots of the kernel; ``PlanState``;
* ``actions``: one kernel change each (``Blocked``, ``Waiting`` and notes change nothing);
* ``status``: per-object status derived from a plan.

All immutable; nothing here does I/O. Import from ``rdmad.model``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rdmad.model.actions import (
        Action,
        AddRxe,
        BindVfDriver,
        Blocked,
        DeleteRxe,
        InUseDrift,
        LoadModule,
        SetIbVf,
        SetLinkUp,
        SetNumVfs,
        SetVfSettings,
        SyncGuardHook,
        Unsupported,
        VfChange,
        Waiting,
        action_touches,
        format_value,
    )
    from rdmad.model.desired import (
        ApiSpec,
        DaemonSpec,
        Desired,
        MetricsSpec,
        NetdevRef,
        PeermemSpec,
        PfRef,
        RxeSpec,
        SriovSpec,
        VfSpec,
    )
    from rdmad.model.observed import (
        FREE,
        GuardHookObserved,
        IbVfSettings,
        ModulesObserved,
        NetdevObserved,
        Observed,
        PauseObserved,
        PfObserved,
        PlanState,
        RdmaLinkObserved,
        UnsupportedKey,
        Usage,
        Use,
        VfObserved,
        VfSettings,
    )
    from rdmad.model.status import (
        AttrStatus,
        ObjectDetail,
        ObjectState,
        ObjectStatus,
        VfStatus,
        summarize,
    )
    from rdmad.model.values import (
        NO_DRIVER,
        AnyMac,
        Guid,
        IbPolicy,
        IfName,
        InUseDriftPolicy,
        LinkState,
        ModuleName,
        PciAddress,
        RdmaName,
        UnicastMac,
        VlanProto,
        parse_duration,
    )

# Where each name lives. Submodules load on first use (PEP 562): the kernel layer and
# the guard need only ``observed`` and must not pay for pydantic (``desired``, ``values``),
# about 130 ms of a guard decision that runs inside `modprobe -r`.
_HOME = {
    "Action": "rdmad.model.actions",
    "AddRxe": "rdmad.model.actions",
    "BindVfDriver": "rdmad.model.actions",
    "Blocked": "rdmad.model.actions",
    "DeleteRxe": "rdmad.model.actions",
    "InUseDrift": "rdmad.model.actions",
    "LoadModule": "rdmad.model.actions",
    "SetIbVf": "rdmad.model.actions",
    "SetLinkUp": "rdmad.model.actions",
    "SetNumVfs": "rdmad.model.actions",
    "SetVfSettings": "rdmad.model.actions",
    "SyncGuardHook": "rdmad.model.actions",
    "Unsupported": "rdmad.model.actions",
    "VfChange": "rdmad.model.actions",
    "Waiting": "rdmad.model.actions",
    "action_touches": "rdmad.model.actions",
    "format_value": "rdmad.model.actions",
    "ApiSpec": "rdmad.model.desired",
    "DaemonSpec": "rdmad.model.desired",
    "Desired": "rdmad.model.desired",
    "MetricsSpec": "rdmad.model.desired",
    "NetdevRef": "rdmad.model.desired",
    "PeermemSpec": "rdmad.model.desired",
    "PfRef": "rdmad.model.desired",
    "RxeSpec": "rdmad.model.desired",
    "SriovSpec": "rdmad.model.desired",
    "VfSpec": "rdmad.model.desired",
    "FREE": "rdmad.model.observed",
    "IbVfSettings": "rdmad.model.observed",
    "GuardHookObserved": "rdmad.model.observed",
    "PauseObserved": "rdmad.model.observed",
    "ModulesObserved": "rdmad.model.observed",
    "NetdevObserved": "rdmad.model.observed",
    "Observed": "rdmad.model.observed",
    "PfObserved": "rdmad.model.observed",
    "PlanState": "rdmad.model.observed",
    "RdmaLinkObserved": "rdmad.model.observed",
    "UnsupportedKey": "rdmad.model.observed",
    "Usage": "rdmad.model.observed",
    "Use": "rdmad.model.observed",
    "VfObserved": "rdmad.model.observed",
    "VfSettings": "rdmad.model.observed",
    "AttrStatus": "rdmad.model.status",
    "ObjectDetail": "rdmad.model.status",
    "ObjectState": "rdmad.model.status",
    "ObjectStatus": "rdmad.model.status",
    "VfStatus": "rdmad.model.status",
    "summarize": "rdmad.model.status",
    "NO_DRIVER": "rdmad.model.values",
    "AnyMac": "rdmad.model.values",
    "Guid": "rdmad.model.values",
    "IbPolicy": "rdmad.model.values",
    "IfName": "rdmad.model.values",
    "InUseDriftPolicy": "rdmad.model.values",
    "LinkState": "rdmad.model.values",
    "ModuleName": "rdmad.model.values",
    "PciAddress": "rdmad.model.values",
    "RdmaName": "rdmad.model.values",
    "UnicastMac": "rdmad.model.values",
    "VlanProto": "rdmad.model.values",
    "parse_duration": "rdmad.model.values",
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


__all__ = [
    "FREE",
    "NO_DRIVER",
    "Action",
    "AddRxe",
    "AnyMac",
    "ApiSpec",
    "AttrStatus",
    "BindVfDriver",
    "Blocked",
    "DaemonSpec",
    "DeleteRxe",
    "Desired",
    "GuardHookObserved",
    "Guid",
    "IbPolicy",
    "IbVfSettings",
    "IfName",
    "InUseDrift",
    "InUseDriftPolicy",
    "LinkState",
    "LoadModule",
    "MetricsSpec",
    "ModuleName",
    "ModulesObserved",
    "NetdevObserved",
    "NetdevRef",
    "ObjectDetail",
    "ObjectState",
    "ObjectStatus",
    "Observed",
    "PauseObserved",
    "PciAddress",
    "PeermemSpec",
    "PfObserved",
    "PfRef",
    "PlanState",
    "RdmaLinkObserved",
    "RdmaName",
    "RxeSpec",
    "SetIbVf",
    "SetLinkUp",
    "SetNumVfs",
    "SetVfSettings",
    "SriovSpec",
    "SyncGuardHook",
    "UnicastMac",
    "Unsupported",
    "UnsupportedKey",
    "Usage",
    "Use",
    "VfChange",
    "VfObserved",
    "VfSettings",
    "VfSpec",
    "VfStatus",
    "VlanProto",
    "Waiting",
    "action_touches",
    "format_value",
    "parse_duration",
    "summarize",
]
