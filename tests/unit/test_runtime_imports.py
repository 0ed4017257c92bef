"""rdmad speaks netlink itself: importing the daemon's kernel layer loads no pyroute2."""

from __future__ import annotations

import subprocess
import sys


def test_kernel_layer_imports_without_pyroute2() -> None:
    code = (
        "import sys\n"
        "import rdmad.kernel.host, rdmad.kernel.rdma\n"
        "import rdmad.kernel.linkevents, rdmad.kernel.rtnetlink\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyroute2'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
