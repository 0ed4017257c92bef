"""bench/headline.py's ratio_spread: how far a p50 ratio of a few noisy samples moves by
sampling alone (bench_rxe prints it beside each p50 ratio)."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("headline", REPO / "bench/headline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


headline = _load()


def noisy(n: int, seed: int, scale: float) -> list[float]:
    rng = random.Random(seed)
    return [scale * rng.lognormvariate(0, 0.6) for _ in range(n)]


def test_the_same_samples_give_the_same_spread() -> None:
    mine, base = noisy(20, 1, 10.0), noisy(20, 2, 25.0)
    assert headline.ratio_spread(mine, base) == headline.ratio_spread(mine, base)


def test_without_noise_there_is_no_spread() -> None:
    assert headline.ratio_spread([3.0] * 20, [10.0] * 20) == (0.3, 0.3)


def test_the_runs_own_ratio_lies_within_and_fewer_samples_spread_wider() -> None:
    mine, base = noisy(20, 3, 10.0), noisy(20, 4, 25.0)
    lo, hi = headline.ratio_spread(mine, base)
    point = headline.pct(mine, 50) / headline.pct(base, 50)
    assert lo <= point <= hi and lo < hi
    lo_many, hi_many = headline.ratio_spread(noisy(400, 3, 10.0), noisy(400, 4, 25.0))
    assert hi_many - lo_many < (hi - lo) / 2


def test_no_samples_on_a_side_is_no_spread() -> None:
    assert headline.ratio_spread([], [1.0]) is None
    assert headline.ratio_spread([1.0], []) is None
    assert headline.ratio_spread([1.0], [0.0]) is None
