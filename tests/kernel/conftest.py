"""Fixtures shared by the kernel tests that make devices on this machine."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from tests.support.netns import owned_netns


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace of the test's own, deleted after it."""
    with owned_netns() as name:
        yield name


@pytest.fixture
def veth_names() -> Iterator[tuple[str, str]]:
    """Two fresh names for a veth pair the test creates; the pair is deleted after it."""
    tag = uuid.uuid4().hex[:6]
    names = (f"rdu{tag}a", f"rdu{tag}b")
    try:
        yield names
    finally:
        subprocess.run(["ip", "link", "del", names[0]], check=False, capture_output=True)
