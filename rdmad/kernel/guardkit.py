"""The driver guard for a host that does not have rdmad's package (rdmad in a container).

``rdmad run --guard-kit DIR`` (the Kubernetes DaemonSet): the hook rdmad writes into
the host's /etc/modprobe.d runs in the host's `modprobe -r`, so it must name a program
the host has; the container's interpreter is not one. DIR is a host directory the pod
mounts at the same path. At start rdmad copies its own package there,
``DIR/rdmad-VERSION-HASH/`` (the guard imports only the standard library: an
import-linter contract, and tests run it with ``python3 -I -S``, as the host will),
and writes ``DIR/hook``, which the hook lines run: it picks the host's Python 3.10 or
later and runs the guard from that copy, which decides from the kernel alone as the
packaged guard does.

Never blocking an unload it cannot judge: with no Python 3.10+ on the host, the hook
lets the unload go ahead and says so in the journal; with the copy gone, the hook line
itself does (``guardhook.render``: ``[ -e DIR/hook ] || exec modprobe -r ...``). When
the pod is deleted rdmad removes the hook file on its way out (daemon.run); a pod that
crashed leaves the hook and the copy, and the guard still judges from the kernel.
An image with another rdmad makes another copy and points the hook at it; older
copies are removed.

Standard library only (the kernel layer's contracts).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from pathlib import Path

from rdmad import __version__
from rdmad.fileio import write_atomic

HOOK = "hook"
PREFIX = "rdmad-"
MIN_PYTHON = (3, 10)
PACKAGE = Path(__file__).resolve().parents[1]  # the rdmad package this process runs

ENTRY = """\
# rdmad's driver guard, run by DIR/hook with the host's python3 (-I -S: nothing of the
# host's environment or site-packages). Written by rdmad; do not edit.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rdmad.guard.cli import main

sys.exit(main())
"""

HOOK_SCRIPT = """\
#!/bin/sh
# rdmad's driver guard on a host without rdmad's package, written by rdmad running in a
# container (rdmad run --guard-kit). /etc/modprobe.d/rdmad-guard.conf runs it as
# `hook remove MODULE`. Do not edit: rdmad rewrites it at every start.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
kit={kit}
if [ -f "$kit/guard.py" ]; then
    for py in python3 python3.13 python3.12 python3.11 python3.10; do
        p=$(command -v "$py" 2>/dev/null) || continue
        if "$p" -I -S -c 'import sys; sys.exit(sys.version_info < {min_python})' 2>/dev/null; then
            exec "$p" -I -S "$kit/guard.py" "$@"
        fi
    done
    why="no python3 >= {min_text} on this host"
else
    why="its copy $kit is gone"
fi
# Nothing here can judge the unload: it goes ahead, and the journal says why.
msg="rdmad-guard: cannot judge 'modprobe -r $2' ($why); unloading unguarded"
logger -t rdmad-guard -p daemon.warning "$msg" 2>/dev/null || echo "$msg" >&2
if [ "$1" = remove ] && [ -n "$2" ]; then
    exec {modprobe} -r --ignore-remove "$2"
fi
exit 0
"""


def _files(package: Path) -> list[Path]:
    """The package's Python sources, in a stable order (no caches)."""
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def kit_name(package: Path = PACKAGE) -> str:
    """``rdmad-VERSION-HASH``: another rdmad (another image) makes another copy."""
    digest = hashlib.sha256()
    for path in _files(package):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return f"{PREFIX}{__version__}-{digest.hexdigest()[:12]}"


def install(directory: str | os.PathLike[str], modprobe: str, package: Path = PACKAGE) -> str:
    """Copy the guard into ``directory`` and write its hook script; return the hook's
    path, the command the modprobe.d lines run. Raises OSError when it cannot."""
    base = Path(directory)
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    kit = base / kit_name(package)
    if not (kit / "guard.py").is_file():
        staging = base / f".{kit.name}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        for path in _files(package):
            target = staging / "rdmad" / path.relative_to(package)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        (staging / "guard.py").write_text(ENTRY)
        shutil.rmtree(kit, ignore_errors=True)
        os.rename(staging, kit)  # the copy appears whole or not at all
    script = HOOK_SCRIPT.format(
        kit=shlex.quote(str(kit)),
        min_python=MIN_PYTHON,
        min_text=".".join(map(str, MIN_PYTHON)),
        modprobe=shlex.quote(modprobe),
    )
    hook = base / HOOK
    write_atomic(hook, script.encode(), mode=0o755)
    for old in base.glob(f"{PREFIX}*"):  # copies of other rdmad versions (images)
        if old != kit and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return str(hook)
