"""rdmad loads pyroute2's message classes only, and the full library still works on demand."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import rdmad.kernel.netlink, rdmad.kernel.rdma
lean = sorted(k for k in sys.modules if k.startswith("pyroute2"))
from pyroute2 import IPRoute
import pyroute2
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from rdmad.kernel import pyroute2_lean
print(json.dumps({
    "lean": len(lean),
    "full": len([k for k in sys.modules if k.startswith("pyroute2")]),
    "iproute": IPRoute.__name__,
    "netns": hasattr(pyroute2, "NetNS"),
    "same_class": ifinfmsg is pyroute2_lean.ifinfmsg,
}))
"""


def test_lean_import_then_full_library_on_demand() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout)
    assert got["lean"] < 40, got  # the package __init__ alone pulls in ~160 modules
    assert got["full"] > got["lean"]
    assert got["iproute"] == "IPRoute" and got["netns"] and got["same_class"]
