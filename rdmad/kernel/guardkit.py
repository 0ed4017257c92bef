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

Root runs what is in DIR, so nothing in it is trusted as found. DIR and every directory
above it must belong to root (or to the user rdmad runs as) and be writable by nobody
else, a sticky directory above it (/tmp) excepted: there others cannot rename or remove
what is not theirs. Otherwise rdmad refuses to start, saying which directory and why.
The copy is checked against this rdmad's own files at every start and made again when
any file differs, is missing or is not a plain file; it is staged in a new directory
that only rdmad made (``mkdtemp``: no path someone else created is followed) and renamed
into place. A copy broken after the start (a module deleted) cannot judge: the guard
exits with GUARD_BROKEN and the hook lets the unload go ahead, saying so in the journal,
as with no Python.

Standard library only (the kernel layer's contracts).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import stat
import tempfile
from pathlib import Path

from rdmad import __version__
from rdmad.fileio import write_atomic

HOOK = "hook"
PREFIX = "rdmad-"
MIN_PYTHON = (3, 10)
PACKAGE = Path(__file__).resolve().parents[1]  # the rdmad package this process runs
GUARD_BROKEN = 125  # guard.py could not import the guard: the hook unloads unguarded

log = logging.getLogger("rdmad.kernel")

ENTRY = f"""\
# rdmad's driver guard, run by DIR/hook with the host's python3 (-I -S: nothing of the
# host's environment or site-packages). Written by rdmad; do not edit.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from rdmad.guard.cli import main
except Exception as exc:  # a broken copy cannot judge: the hook says so and goes ahead
    print(f"rdmad-guard: its copy is broken ({{type(exc).__name__}}: {{exc}})", file=sys.stderr)
    sys.exit({GUARD_BROKEN})

sys.exit(main())
"""


class UnsafeKit(OSError):
    """The guard kit's directory could be changed by someone other than root."""


HOOK_SCRIPT = """\
#!/bin/sh
# rdmad's driver guard on a host without rdmad's package, written by rdmad running in a
# container (rdmad run --guard-kit). /etc/modprobe.d/rdmad-guard.conf runs it as
# `hook remove MODULE`. Do not edit: rdmad rewrites it at every start.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
kit={kit}
if [ -f "$kit/guard.py" ]; then
    why="no python3 >= {min_text} on this host"
    for py in python3 python3.13 python3.12 python3.11 python3.10; do
        p=$(command -v "$py" 2>/dev/null) || continue
        if "$p" -I -S -c 'import sys; sys.exit(sys.version_info < {min_python})' 2>/dev/null; then
            "$p" -I -S "$kit/guard.py" "$@"
            rc=$?
            [ "$rc" -eq {broken} ] || exit "$rc"
            why="its copy $kit is broken"
            break
        fi
    done
else
    why="its copy $kit is gone"
fi
# Nothing here can judge the unload: it goes ahead, and the journal and whoever typed
# the modprobe are told why.
msg="rdmad-guard: cannot judge 'modprobe -r $2' ($why); unloading unguarded"
logger -t rdmad-guard -p daemon.warning "$msg" 2>/dev/null
echo "$msg" >&2
if [ "$1" = remove ] && [ -n "$2" ]; then
    exec {modprobe} -r --ignore-remove "$2"
fi
exit 0
"""


def _files(package: Path) -> list[Path]:
    """The package's Python sources, in a stable order (no caches)."""
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


def _digest(package: Path) -> str:
    digest = hashlib.sha256()
    for path in _files(package):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def kit_name(package: Path = PACKAGE) -> str:
    """``rdmad-VERSION-HASH``: another rdmad (another image) makes another copy."""
    return f"{PREFIX}{__version__}-{_digest(package)[:12]}"


def check_directory(directory: Path) -> None:
    """Raise UnsafeKit unless ``directory`` and every directory above it belong to root
    (or to this process's user) and nobody else can write to them; a sticky directory
    above it may be writable by all (others cannot replace what is not theirs)."""
    owners = {0, os.geteuid()}
    path = directory.resolve()
    for place in (path, *path.parents):
        st = os.stat(place)
        if st.st_uid not in owners:
            raise UnsafeKit(
                f"{place} belongs to uid {st.st_uid}, not root: the guard kit's hook runs "
                "what is in it as root"
            )
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        sticky_parent = place != path and st.st_mode & stat.S_ISVTX
        if writable and not sticky_parent:
            raise UnsafeKit(
                f"{place} is writable by its group or by all (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): the guard kit's hook runs what is in it "
                "as root; `chmod go-w` it"
            )


def _differs(kit: Path, package: Path) -> str | None:
    """Why the copy in ``kit`` is not this rdmad's guard, or None when it is."""
    if kit.is_symlink() or not kit.is_dir():
        return "missing" if not os.path.lexists(kit) else "not a directory"
    try:
        if (kit / "guard.py").read_text() != ENTRY:
            return "guard.py differs"
        if _digest(kit / "rdmad") != _digest(package):
            return "its files differ from this rdmad's"
    except OSError as exc:
        return f"unreadable ({exc})"
    return None


def _stage(base: Path, name: str, package: Path) -> Path:
    """A whole copy in a directory that only this call made (never a path found)."""
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=base))
    try:
        for path in _files(package):
            target = staging / "rdmad" / path.relative_to(package)
            target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            target.chmod(0o644)
        (staging / "guard.py").write_text(ENTRY)
        staging.chmod(0o755)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _remove(path: Path) -> None:
    """Remove a file, a symlink (never followed) or a directory tree."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)


def hook_command(hook: str) -> str:
    """What the modprobe.d lines run: the hook through /bin/sh, never exec'd itself (a
    host directory mounted noexec would make every `modprobe -r` fail with 126)."""
    return f"/bin/sh {shlex.quote(hook)}"


def hook_path(directory: str | os.PathLike[str]) -> str:
    """The hook script ``install`` writes in ``directory`` (what the hook lines run)."""
    return str(Path(directory) / HOOK)


def install(directory: str | os.PathLike[str], modprobe: str, package: Path = PACKAGE) -> str:
    """Copy the guard into ``directory`` (again when the copy there differs) and write
    its hook script; return the hook's path, the command the modprobe.d lines run.
    Raises OSError when it cannot, UnsafeKit when others could change the directory."""
    base = Path(directory)
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    check_directory(base)
    kit = base / kit_name(package)
    why = _differs(kit, package)
    if why is not None:
        if why != "missing":
            log.warning("the guard kit copy %s is not this rdmad's (%s): made again", kit, why)
        staging = _stage(base, kit.name, package)
        try:
            _remove(kit)
            os.rename(staging, kit)  # the copy appears whole or not at all
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    script = HOOK_SCRIPT.format(
        kit=shlex.quote(str(kit)),
        min_python=MIN_PYTHON,
        min_text=".".join(map(str, MIN_PYTHON)),
        modprobe=shlex.quote(modprobe),
        broken=GUARD_BROKEN,
    )
    hook = Path(hook_path(base))
    write_atomic(hook, script.encode(), mode=0o755)
    for old in base.glob(f"{PREFIX}*"):  # copies of other rdmad versions (images)
        if old != kit:
            _remove(old)
    for left in base.glob(f".{PREFIX}*"):  # stagings of a start that was killed
        _remove(left)
    return str(hook)
