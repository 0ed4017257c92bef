"""Saved guest states kept between runs, keyed by what makes them.

A saved state (harness.SavedBoot: a disk and QEMU's migration stream) is made once
and reused by every later run, xdist worker, benchmark and the demo, until one of its
inputs changes: the guest image, QEMU's version, the QEMU command line (with this
checkout's paths left out: the 9p share is unmounted in every saved state, so where it
points does not reach the stream), the harness code that boots and saves, and for a
state made from another one, that one's key and what was added (the `.deb`'s content).
A changed input is a new key, so a stale state is never used; it is made again by a
real boot (the clean state) or from the clean state (the installed one).

Layout, in the image cache's `states/` (beside the `img-KEY/` directories)::

    NAME-KEY/      what the maker left (rootfs.img, state), inputs.json, made.json (last)
    NAME-KEY.lock  flock: exclusive while it is made, shared while a pool uses it

A state is made in `NAME-KEY.tmp-PID/` and renamed into place, so a reader never sees
half of one. After a new state is made, older states of the same name beyond the
newest KEEP are removed, each only if no pool holds its lock (a guest may be running
on its disk).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

# States per name: the current one and the one before (a branch switch back), for each of
# the two vCPU counts a run uses (harness.ALONE_CPUS, BESIDE_CPUS).
KEEP = 4
_MADE = "made.json"
_MADE_AT = "made_at_ns"  # in made.json: the newest are kept (mtimes tick too coarsely)
_INPUTS = "inputs.json"


def state_key(inputs: Mapping[str, str]) -> str:
    """A short hash of a state's inputs (every value a string)."""
    text = json.dumps(dict(inputs), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


Made = tuple[Path, dict[str, Any]]  # a state's directory, and what its maker returned


class StateCache:
    """The states under ``root``; locks held by this process stay until release()."""

    def __init__(self, root: Path, log: Callable[[str], None]) -> None:
        self.root = root
        self.log = log
        self._held: list[IO[bytes]] = []

    def obtain(
        self, name: str, inputs: Mapping[str, str], make: Callable[[Path], dict[str, Any]]
    ) -> Made:
        """The state NAME for ``inputs``: its directory and the document ``make``
        returned when it was made (JSON), made now with ``make(directory)`` if there is
        none. Held (a shared lock) until release(): not removed while this process may
        start guests from it. What ``make`` raises propagates (nothing is kept).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        key = state_key(inputs)
        final = self.root / f"{name}-{key}"
        lock = (self.root / f"{name}-{key}.lock").open("a+b")
        started = time.monotonic()
        try:
            fcntl.flock(lock, fcntl.LOCK_SH)  # held: a pruner leaves it alone
            made = _load(final)
            if made is None:
                fcntl.flock(lock, fcntl.LOCK_EX)  # one maker; the others wait for it
                made = _load(final)
                if made is None:
                    made = self._make(final, name, inputs, make)
                    self._prune(name, keep=final)
                else:
                    self._made_by_another(name, key, started)
                fcntl.flock(lock, fcntl.LOCK_SH)
            elif time.monotonic() - started > 1:
                self._made_by_another(name, key, started)
            else:
                self.log(f"{name} state {key}: as an earlier run left it")
        except BaseException:
            lock.close()
            raise
        self._held.append(lock)
        return made

    def _made_by_another(self, name: str, key: str, since: float) -> None:
        waited = time.monotonic() - since
        self.log(f"{name} state {key}: made by another process (waited {waited:.0f} s)")

    def release(self) -> None:
        for lock in self._held:
            lock.close()
        self._held = []

    def _make(
        self,
        final: Path,
        name: str,
        inputs: Mapping[str, str],
        make: Callable[[Path], dict[str, Any]],
    ) -> Made:
        work = final.with_name(f"{final.name}.tmp-{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            doc = make(work)
            (work / _INPUTS).write_text(json.dumps(dict(inputs), indent=1, sort_keys=True) + "\n")
            made = {**doc, _MADE_AT: time.time_ns()}
            (work / _MADE).write_text(json.dumps(made) + "\n")  # last: the state is whole
            os.rename(work, final)
        except OSError:
            shutil.rmtree(work, ignore_errors=True)
            made = _load(final)  # a maker that held a pruned lock file's twin won the rename
            if made is None:
                raise
            return made
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        self.log(f"{name} state {final.name.rsplit('-', 1)[1]}: made")
        return final, doc

    def _prune(self, name: str, *, keep: Path) -> None:
        """Remove what a killed maker left, and states of ``name`` beyond the newest
        KEEP that no process holds."""
        for work in self.root.glob(f"{name}-*.tmp-*"):
            pid = work.name.rsplit(".tmp-", 1)[1]
            if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
                shutil.rmtree(work, ignore_errors=True)
        others = [
            p
            for p in self.root.glob(f"{name}-*")
            if p.is_dir() and p != keep and ".tmp-" not in p.name
        ]
        others.sort(key=_made_at, reverse=True)
        for directory in others[KEEP - 1 :]:
            lock_path = directory.with_name(directory.name + ".lock")
            with lock_path.open("a+b") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a pool has guests on it
                shutil.rmtree(directory, ignore_errors=True)
                lock_path.unlink(missing_ok=True)
            self.log(f"removed the old state {directory.name}")


def _load(directory: Path) -> Made | None:
    """A whole state (its maker's document written), or None."""
    try:
        made = json.loads((directory / _MADE).read_text())
    except (OSError, ValueError):
        return None
    made.pop(_MADE_AT, None)
    return directory, made


def _made_at(directory: Path) -> int:
    try:
        return int(json.loads((directory / _MADE).read_text())[_MADE_AT])
    except (OSError, ValueError, KeyError, TypeError):
        return 0  # half-made or foreign: first to go
