"""``timeout()``: ``asyncio.timeout`` from Python 3.11, ``async_timeout`` on 3.10.

async-timeout is where asyncio.timeout came from and aiohttp's own dependency on 3.10;
it is rdmad's dependency only there (pyproject's marker). On 3.10 a timeout raises
``asyncio.TimeoutError``, which 3.11 made the builtin ``TimeoutError``: callers catch
``asyncio.TimeoutError``, the one name right on both.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from asyncio import timeout
else:  # checked by mypy as Python 3.10 (pyproject [tool.mypy])
    from async_timeout import timeout

__all__ = ["timeout"]
