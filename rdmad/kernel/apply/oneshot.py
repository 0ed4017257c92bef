"""One observation for the command line (``rdmad plan``, ``rdmad snapshot``).

A root other than "/" is a sysfs tree (fake or copied), where netlink would
describe the wrong machine, so VF settings are reported as unknown there; "/" is
this host, read through rtnetlink and (when the kernel has it) RDMA netlink.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from rdmad.kernel.apply.host import KernelHost
from rdmad.kernel.apply.observe import observe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Observed


def observe_host(root: Path) -> Observed:
    """Observe ``root``: a sysfs tree (no netlink), or "/" (this host, with netlink).

    For "/", RDMA devices come from RDMA netlink when the kernel has it, from
    sysfs otherwise; ``rdma_netlink`` is False only when rxe is impossible here.
    """
    if Path(root) != Path("/"):
        return observe(
            Sysfs(root),
            no_netlink_reason=f"VF settings are read over netlink, which cannot see into {root}",
        )

    async def run() -> Observed:
        async with KernelHost("/") as host:
            return await host.observe()

    return asyncio.run(run())
