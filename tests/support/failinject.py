"""Errors injected at chosen paths of a fake tree, as the kernel gives them under load.

``FailAt(monkeypatch)`` wraps ``os.listdir``, ``os.scandir``, ``os.readlink``,
``os.lstat`` and ``open`` so that a call on one of the registered paths raises
``OSError(code)`` (EMFILE while a flood holds every descriptor, EACCES, EIO); every
other path goes to the real call. Paths are compared after normalisation, so
``ROOT/proc`` matches however the code under test spelled it.
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

_WRAPPED = ("listdir", "scandir", "readlink", "lstat")


class FailAt:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root = Path(root)
        self.failing: dict[str, tuple[int, frozenset[str]]] = {}
        self.hits: list[str] = []  # the paths an error was raised for, in order
        for name in _WRAPPED:
            monkeypatch.setattr(os, name, self._wrap(name, getattr(os, name)))
        monkeypatch.setattr(builtins, "open", self._wrap("open", builtins.open))

    def fail(self, rel: str, code: int, *calls: str) -> None:
        """``rel`` (under the root) raises ``code`` for ``calls`` (default: a listing)."""
        key = os.path.normpath(self.root / rel)
        self.failing[key] = (code, frozenset(calls or ("listdir", "scandir")))

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any = ".", *args: Any, **kwargs: Any) -> Any:
            if isinstance(path, (str, os.PathLike)):
                key = os.path.normpath(os.fspath(path))
                hit = self.failing.get(key)
                if hit is not None and name in hit[1]:
                    self.hits.append(key)
                    raise OSError(hit[0], os.strerror(hit[0]), os.fspath(path))
            return real(path, *args, **kwargs)

        return call
