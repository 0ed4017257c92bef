"""Who uses an RDMA device, from the kernel's resource tracking (RDMA netlink RES_*_GET).

Pure: tracked objects in, ``Usage`` per device out. A process that opened a device
shows in ``observe``'s uverbs-fd scan too; kernel users (NFS over RDMA, iSER,
nvme-rdma) hold no file at all and show only here.

An idle device is not empty: ib_core creates its own management objects (the MAD
QP1, plus QP0 on InfiniBand ports, with their PD and CQs) when a device registers.
Those are the baseline and do not count; any other object, user or kernel, does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from rdmad.kernel.netlink.rdma_codec import ResObject
from rdmad.model.shared_observed import FREE, Usage, Use

# Kernel modules whose objects are part of every registered device (ib_mad is built
# into ib_core). Measured on an idle rxe device: see tests/lab/test_lab_rdma.py.
BASELINE_OWNERS = frozenset({"ib_core"})
_LABELS = {"qp": "QP", "cq": "CQ", "pd": "PD"}


def is_baseline(obj: ResObject) -> bool:
    return obj.pid is None and obj.kern_name in BASELINE_OWNERS


def _count(kind: str, n: int) -> str:
    return f"{n} {_LABELS[kind]}{'s' if n != 1 else ''}"


def device_usage(
    objects: Iterable[ResObject], comm: Callable[[int], str | None]
) -> dict[str, Usage]:
    """Usage by device name for every device that has objects beyond the baseline.

    Devices not in the result hold only baseline objects (FREE). Holders read
    "pid 123 (ibv_rc_pingpong): 1 QP, 1 CQ, 1 PD" or "kernel user rpcrdma: 2 QPs".
    """
    owners: dict[str, dict[tuple[str, int | str], dict[str, int]]] = {}
    for obj in objects:
        if is_baseline(obj):
            continue
        key: tuple[str, int | str] = (
            ("pid", obj.pid) if obj.pid is not None else ("kernel", obj.kern_name or "?")
        )
        counts = owners.setdefault(obj.dev_name, {}).setdefault(key, {})
        counts[obj.kind] = counts.get(obj.kind, 0) + 1
    out = {}
    for dev, by_owner in owners.items():
        holders = []
        for (what, who), counts in sorted(by_owner.items(), key=lambda kv: str(kv[0])):
            objs = ", ".join(_count(k, counts[k]) for k in ("qp", "cq", "pd") if k in counts)
            if what == "pid":
                name = comm(int(who))
                holders.append(f"pid {who}{f' ({name})' if name else ''}: {objs}")
            else:
                holders.append(f"kernel user {who}: {objs}")
        out[dev] = Usage(Use.IN_USE, tuple(holders))
    return out


def usage_of(name: str, busy: Mapping[str, Usage], failed: str | None) -> Usage:
    """One device's usage: UNKNOWN (with the reason) when its resources could not be read."""
    if failed is not None:
        return Usage(Use.UNKNOWN, (f"RDMA resources of {name} could not be read: {failed}",))
    return busy.get(name, FREE)
