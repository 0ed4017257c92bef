"""``replace()`` for the model's values in tests, whichever kind they are: msgspec
Structs (the observed model, the config schema), the dataclasses the driver guard
reads too (``rdmad.model.shared_observed``), or the named tuples of the
standard-library-only facts and codecs."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


def replace(obj: T, /, **changes: Any) -> T:
    if isinstance(obj, msgspec.Struct):
        return msgspec.structs.replace(obj, **changes)
    if isinstance(obj, tuple) and hasattr(obj, "_replace"):
        return obj._replace(**changes)  # type: ignore[no-any-return]
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
