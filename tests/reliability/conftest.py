"""Shared pieces for the reliability tests: the agent rig and the API server of the
agent and API suites (imported here so these tests run on the same fixtures), and
running code as another user."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from tests.agent.conftest import rig
from tests.api.conftest import config_dir, make_api, require_root, short_dir, temp_group

__all__ = [
    "as_uid", "config_dir", "make_api", "needs_root", "rig", "root_only", "short_dir",
    "temp_group",
]  # fmt: skip

NOBODY = 65534
NOGROUP = 65534


@pytest.fixture
def needs_root() -> None:
    """Root-only tests (another uid, network namespaces) skip locally without root and
    fail under CI=true, where a skip would hide a broken check (as tests/api does)."""
    require_root("this reliability test")


root_only = pytest.mark.usefixtures("needs_root")


def as_uid(fn: Callable[[], Any], uid: int = NOBODY, gid: int = NOGROUP) -> int:
    """Run ``fn`` in a forked child that has dropped to ``uid``/``gid`` (no groups);
    return its exit code: 0 when ``fn`` returned, 1 when it raised PermissionError,
    2 for any other exception."""
    require_root("a process as another uid")
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 2
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fn()
            code = 0
        except PermissionError:
            code = 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
