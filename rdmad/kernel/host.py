"""KernelHost: observe() the node and apply() actions to it.

observe_host(root) is the synchronous entry used by `rdmad plan`: a root other
than "/" is a sysfs tree (fake or copied), where netlink would describe the
wrong machine, so VF settings are reported as unknown there.
"""

from __future__ import annotations

from pathlib import Path

from rdmad.kernel.observe import observe
from rdmad.kernel.sysfs import Sysfs
from rdmad.model import Observed


def observe_host(root: Path) -> Observed:
    sysfs = Sysfs(root)
    if root != Path("/"):
        return observe(
            sysfs,
            no_netlink_reason=f"VF settings are read over netlink, which cannot see into {root}",
        )
    return observe(sysfs, no_netlink_reason="netlink not read")
