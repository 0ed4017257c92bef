"""Reading rdmad's metrics back the way Prometheus would, for assertions on values."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: bytes | str) -> Samples:
    """Every sample of a text exposition: (name, labels) -> value."""
    if isinstance(text, bytes):
        text = text.decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """One sample's value; None when the series is absent."""
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


async def wait_for(pred: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Until pred() holds, polling; fails after ``timeout`` seconds (a bound, not a proof)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.01)
