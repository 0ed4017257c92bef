"""The status detail of the RDMA subsystem (``[rdma]``): the netns mode declared, in the
running kernel and in ib_core's modprobe.d option, and what stands in the way of a
change (the namespaces the observation named)."""

from __future__ import annotations

from collections.abc import Sequence

from rdmad.model import Action, AttrStatus, Desired, ObjectDetail, Observed
from rdmad.model.actions import SyncIbCoreOptions
from rdmad.reconcile.detail.verdicts import CONVERGED, step_verdict


def rdma_detail(desired: Desired, observed: Observed, actions: Sequence[Action]) -> ObjectDetail:
    want = desired.rdma.netns_mode
    seen = observed.rdma_sys
    live = seen.netns_mode if seen is not None else None
    boot = seen.boot_mode if seen is not None else None
    option = [a for a in actions if isinstance(a, SyncIbCoreOptions)]
    rest = [a for a in actions if not isinstance(a, SyncIbCoreOptions)]
    # ib_core not loaded: nothing is pending in the kernel (it loads in the option's mode).
    live_verdict = step_verdict(rest, same=live == want or live is None)
    boot_verdict = step_verdict(option, same=True) if option else CONVERGED
    return ObjectDetail(
        kind="rdma",
        desired={"netns_mode": want},
        observed={
            "netns_mode": live,
            "ib_core_loaded": live is not None,
            "boot_netns_mode": boot,
            "namespaces": list(seen.namespaces or ()) if seen is not None else [],
            "namespaces_unknown": seen.namespaces_unknown if seen is not None else None,
        },
        attributes=(
            AttrStatus("netns_mode", want, live, *live_verdict),
            AttrStatus("boot_netns_mode", want, boot, *boot_verdict),
        ),
    )


__all__ = ["rdma_detail"]
