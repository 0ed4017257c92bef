"""A missing tool skips locally and fails in CI: never an unchecked pass."""

from __future__ import annotations

import shutil

import pytest

from tests.deploy.conftest import require_module, require_tool


def test_missing_tool_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="promtool not found"):
        require_tool("promtool", "apt-get install prometheus")


def test_missing_tool_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install prometheus"):
        require_tool("promtool", "apt-get install prometheus")


def test_missing_module_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="cannot import no_such_module_here"):
        require_module("no_such_module_here", "pip install it")


def test_missing_module_skips_locally(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="pip install it"):
        require_module("no_such_module_here", "pip install it")
