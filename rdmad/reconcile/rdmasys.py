"""The RDMA subsystem's network-namespace mode (``[rdma] netns_mode``).

Two places hold it, and both are planned:

* the modprobe.d option rdmad writes (``SyncIbCoreOptions``), so that ib_core starts
  in the declared mode at every boot and RDMA stack reload, before any namespace can
  stand in the way: planned first, whatever the kernel has now;
* the running kernel (``SetRdmaNetnsMode``), which changes only while no network
  namespace but the host's exists. When some are known to exist the change is
  ``Blocked``, naming them. Otherwise it is planned and the kernel has the last word,
  atomically (EBUSY): a namespace rdmad could not see (one it could not read, or one
  looked for only after the option was first written) fails the write, not the node.

A change of the mode only decides which namespaces see which RDMA devices; nothing on
the host's namespace loses a device, so with no other namespace it hurts nothing.
While ib_core is not loaded nothing is pending: it loads in the option's mode.
Not declared: the mode is left as it is and rdmad's option file, if any, is removed.
"""

from __future__ import annotations

from rdmad.model import (
    Action,
    Blocked,
    Note,
    Observed,
    RdmaSpec,
    SetRdmaNetnsMode,
    SyncIbCoreOptions,
)

OBJ = "rdma"


def plan_rdma(spec: RdmaSpec, observed: Observed) -> list[Action]:
    seen = observed.rdma_sys
    if seen is None:
        return []
    want = spec.netns_mode
    if want is None:
        if seen.boot_file:
            return [SyncIbCoreOptions(OBJ, "[rdma] netns_mode is not declared", old=seen.boot_mode)]
        return []
    out: list[Action] = []
    if seen.boot_mode != want or not seen.boot_file_current:
        out.append(
            SyncIbCoreOptions(
                OBJ,
                f"ib_core starts in {want} mode at boot and after a reload, before any "
                "network namespace exists",
                mode=want,
                old=seen.boot_mode,
            )
        )
    live = seen.netns_mode
    if live is None:
        out.append(Note(OBJ, f"ib_core is not loaded; it loads in {want} mode"))
        return out
    if live == want:
        return out
    if seen.namespaces:
        also = f" ({seen.namespaces_unknown})" if seen.namespaces_unknown else ""
        listed = "; ".join(seen.namespaces)
        out.append(
            Blocked(
                OBJ,
                f"the RDMA netns mode is {live}, declared {want}: the kernel changes it only "
                f"while no network namespace but the host's exists; {len(seen.namespaces)} "
                f"exist: {listed}{also}. It takes effect at the next boot or ib_core reload "
                "(modprobe.d option)",
            )
        )
        return out
    out.append(SetRdmaNetnsMode(OBJ, f"declared {want}", old=live, new=want))
    return out


def declared(spec: RdmaSpec) -> list[str]:
    return [OBJ] if spec.netns_mode is not None else []
