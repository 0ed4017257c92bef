"""``tomllib``: the standard library's from Python 3.11, ``tomli`` on 3.10.

rdmad runs on Python 3.10 and later (Ubuntu 22.04, Jetson and IGX nodes have 3.10).
tomllib is tomli adopted into the standard library, same API; tomli is a dependency
only on 3.10 (pyproject's marker). Kept apart from asyncio's backport
(rdmad/api/timeouts.py): rdmad-ctl reads the config through this and must not import
asyncio.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # checked by mypy as Python 3.10 (pyproject [tool.mypy])
    import tomli as tomllib

__all__ = ["tomllib"]
