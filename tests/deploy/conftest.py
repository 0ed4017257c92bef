"""Shared helpers for the deploy/ checks: where deploy/ is, tool and module lookup.

A missing tool (or Python module) skips a test locally (saying how to install it) and fails it in CI
(CI=true), so a CI run never counts an unchecked artefact as passing.
"""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "METRICS.md"


def require_tool(name: str, install_hint: str) -> str:
    """Path of `name`, or skip (locally) / fail (CI) saying how to get it."""
    path = shutil.which(name)
    if path is not None:
        return path
    missing(f"{name} not found: {install_hint}")


def require_module(name: str, install_hint: str) -> ModuleType:
    """The module `name`, or skip (locally) / fail (CI) saying how to get it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"cannot import {name} ({exc}): {install_hint}")


def missing(message: str) -> NoReturn:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)
