"""Validating the merged config: the schema (``rdmad.model.validation``) and the rules
that span objects, every problem named by the file and key it came from.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rdmad.config.errors import ConfigError
from rdmad.config.merge import Merger
from rdmad.model import Desired, NetdevRef
from rdmad.model.desired import NO_PF
from rdmad.model.validation import SpecError, validate


def parse(docs: Iterable[tuple[str, dict[str, Any]]]) -> tuple[Desired | None, list[ConfigError]]:
    """Merge parsed TOML documents (in order) and validate the result."""
    merger = Merger()
    for file, doc in docs:
        merger.add(file, doc)
    errors: list[ConfigError] = list(merger.repeats)
    # An [[sriov]] with neither pf nor select is told with the other errors, as a
    # missing required key is (the Struct's own check runs only when the rest is valid).
    sriov = merger.merged.get("sriov")
    for i, item in enumerate(sriov if isinstance(sriov, list) else []):
        if isinstance(item, dict) and "pf" not in item and "select" not in item:
            errors.append(ConfigError(*merger.origin(("sriov", i, "pf")), NO_PF))
    try:
        desired = validate(Desired, merger.merged)
    except SpecError as exc:
        for loc, message in exc.problems:
            if message == NO_PF:
                continue  # said above
            file, path = merger.origin(loc)
            errors.append(ConfigError(file, path, message))
        return None, errors
    errors.extend(_cross_checks(desired, merger))
    errors.extend(_one_mac_per_vf(desired, merger))
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


def _one_mac_per_vf(desired: Desired, merger: Merger) -> list[ConfigError]:
    """The same MAC declared for two VFs of one PF: on the PF's embedded switch each would
    answer for the other. Named at the second, with the first's file and key.

    Two VFs of two PFs may share one: a VM bonding a VF of each port for failover is given
    the same MAC on both (with spoof checking on, the bond's MAC must be each VF's own).
    """
    errors = []
    for i, pf in enumerate(desired.sriov):
        first: dict[str, tuple[str, str]] = {}
        for j, vf in enumerate(pf.vf):
            if not isinstance(mac := vf.mac, str):
                continue  # none declared, or derived on the node (checked there)
            file, path = merger.origin(("sriov", i, "vf", j, "mac"))
            key = str(mac).lower()
            if key in first:
                other_file, other_path = first[key]
                where = other_path if other_file == file else f"{other_file}: {other_path}"
                errors.append(ConfigError(file, path, f"MAC {key} is also declared at {where}"))
            else:
                first[key] = (file, path)
    return errors
