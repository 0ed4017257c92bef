"""Validating the merged config: the schema (``rdmad.model.validation``) and the rules
that span objects, every problem named by the file and key it came from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rdmad.config.errors import ConfigError
from rdmad.config.merge import Merger
from rdmad.model import Desired, NetdevRef
from rdmad.model.validation import SpecError, validate


def parse(docs: Iterable[tuple[str, dict[str, Any]]]) -> tuple[Desired | None, list[ConfigError]]:
    """Merge parsed TOML documents (in order) and validate the result."""
    merger = Merger()
    for file, doc in docs:
        merger.add(file, doc)
    errors: list[ConfigError] = []
    try:
        desired = validate(Desired, merger.merged)
    except SpecError as exc:
        for loc, message in exc.problems:
            file, path = merger.origin(loc)
            errors.append(ConfigError(file, path, message))
        return None, errors
    errors.extend(_cross_checks(desired, merger))
    return (None if errors else desired), errors


def _cross_checks(desired: Desired, merger: Merger) -> list[ConfigError]:
    """Rules that span objects: one rxe per netdev, one declaration per PF reference."""
    errors = []
    seen: dict[NetdevRef, int] = {}
    for i, rxe in enumerate(desired.rxe):
        if rxe.netdev in seen:
            other = desired.rxe[seen[rxe.netdev]].name
            file, path = merger.origin(("rxe", i, "netdev"))
            errors.append(
                ConfigError(
                    file,
                    path,
                    f"{rxe.netdev.describe()} already carries rxe {other!r}; "
                    "the kernel allows one rxe link per netdev",
                )
            )
        else:
            seen[rxe.netdev] = i
    return errors
