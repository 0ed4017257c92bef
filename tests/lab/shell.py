"""Boot a lab guest with its serial console on this terminal (scripts/lab-shell.sh).

root is logged in on the console. QEMU is killed by pid when this exits, and
dies with this process (PR_SET_PDEATHSIG) if it is killed.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from harness import (
    ENABLE_HINT,
    QEMU,
    _kill_process,
    find_image,
    qemu_command,
    start_qemu,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--no-iommu",
        action="store_true",
        help="boot without the emulated VT-d (vfio-pci will not bind)",
    )
    args = parser.parse_args()
    image = find_image()
    if image is None or shutil.which(QEMU) is None:
        print(
            f"lab-shell: no QEMU or no image for the current inputs ({ENABLE_HINT})",
            file=sys.stderr,
        )
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="rdmad-lab-shell-"))
    print(
        "lab-shell: booting (TCG, ~30-60 s). Root shell on the console.\n"
        "  repo:  mount -t 9p -o trans=virtio,ro src /mnt/src\n"
        "  quit:  poweroff, or Ctrl-A X\n"
        f"  agent: {workdir / 'qga.sock'}",
        file=sys.stderr,
    )
    cmd = qemu_command(image, workdir, iommu=not args.no_iommu, serial_log=None)
    proc = start_qemu(cmd, workdir, interactive=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return 130
    finally:
        _kill_process(proc)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
