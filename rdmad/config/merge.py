"""Merging the drop-ins: parsed documents, in order, into one config, remembering for
every key the file and key path it came from (so each error names them).

Merge rules (documented in etc/rdmad/rdmad.toml too):

* ``[daemon]``, ``[peermem]``, ``[rdma]`` (any table): key by key, a later file's key wins.
* ``[[rxe]]``: keyed by ``name``; ``[[sriov]]``: keyed by ``pf`` (the same
  reference, e.g. ``pf = { pci = "0000:3b:00.0" }``). A later file that names
  the same object overrides the keys it sets; keys it does not set stay.
  Nested tables (``netdev``, ``pf``) are replaced whole.
* ``[[sriov]]`` with a selector instead: keyed by ``select``, the same table key for key
  (values compared as rdmad reads them: ``"15B3"`` is ``"15b3"``, one value is an array of
  one). A selector and a literal ``pf`` are two declarations, never merged: which one
  a PF follows is decided on the node (rdmad.reconcile.resolve).
* ``[[sriov.vf]]`` entries are keyed by ``index`` within their PF (a VF, ``"0-7"`` or
  ``"rest"``), same rule; a VF's ``in_use_drift`` left unset follows its PF's.
* Within ONE file, overriding is not a merge but a mistake (two ``[[rxe]]`` with one
  ``name``, two ``[[sriov.vf]]`` with one ``index`` under one PF): the merge goes on as
  above, and ``repeats`` keeps both places so validation refuses the config.

Nothing here judges a value: a wrong shape or an unknown key is kept where it was
found so that validation (``validation.py``) reports it with its file.
"""

from __future__ import annotations

from typing import Any

from rdmad import pfselect
from rdmad.config.errors import ConfigError
from rdmad.model.validation import Loc, render


class Merger:
    """Merges documents by object identity and remembers where each key came from."""

    def __init__(self) -> None:
        self.merged: dict[str, Any] = {}
        # merged location -> (file, location in that file)
        self._origin: dict[Loc, tuple[str, Loc]] = {}
        self._last_file = ""
        # Objects declared twice within one file: both places, as errors.
        self.repeats: list[ConfigError] = []
        # For the file being added: merged location -> its first place in that file.
        self._in_file: dict[Loc, Loc] = {}

    def origin(self, loc: Loc) -> tuple[str, str]:
        for cut in range(len(loc), 0, -1):
            hit = self._origin.get(loc[:cut])
            if hit is not None:
                file, file_loc = hit
                return file, render(file_loc + loc[cut:])
        return self._last_file, render(loc)

    def _set(self, loc: Loc, file: str, file_loc: Loc) -> None:
        self._origin[loc] = (file, file_loc)

    def _seen_in_file(self, file: str, merged: Loc, here: Loc, what: str) -> None:
        """Record ``here`` as declaring the object at ``merged``; a second declaration
        of it in the same file is a repeat, named with the first."""
        first = self._in_file.setdefault(merged, here)
        if first != here:
            self.repeats.append(
                ConfigError(file, render(here), f"{what} is already declared at {render(first)}")
            )

    def add(self, file: str, doc: dict[str, Any]) -> None:
        self._last_file = file
        self._in_file = {}
        for key, value in doc.items():
            if key in ("rxe", "sriov") and isinstance(value, list):
                for i, item in enumerate(value):
                    self._add_object(file, key, i, item)
            elif isinstance(value, dict) and isinstance(self.merged.get(key, {}), dict):
                table = self.merged.setdefault(key, {})
                self._set((key,), file, (key,))
                for sub, subval in value.items():
                    table[sub] = subval
                    self._set((key, sub), file, (key, sub))
            else:
                # Wrong shape or unknown key: keep it so validation reports it here.
                self.merged[key] = value
                self._set((key,), file, (key,))

    def _add_object(self, file: str, section: str, i: int, item: Any) -> None:
        objects = self.merged.get(section)
        if not isinstance(objects, list):
            # An earlier file gave the section a wrong shape; a later list replaces it.
            objects = self.merged[section] = []
        identity = _identity(section, item)
        index = next(
            (n for n, o in enumerate(objects) if identity and _identity(section, o) == identity),
            None,
        )
        if index is not None and isinstance(item, dict) and identity:
            # Within one file a second declaration of an object is a mistake (which one
            # wins?), not an override: the same rule for an rxe link and a PF.
            what = (
                f"rxe {item['name']!r}"
                if section == "rxe"
                else f"the selector {identity[1]}"
                if identity[0] == "select"
                else f"PF {_describe(identity)}"
            )
            self._seen_in_file(file, (section, index), (section, i), what)
        if index is None or not isinstance(item, dict):
            objects.append(dict(item) if isinstance(item, dict) else item)
            index = len(objects) - 1
            if identity:
                self._in_file[(section, index)] = (section, i)
            self._set((section, index), file, (section, i))
            if isinstance(item, dict):
                for key in item:
                    self._set((section, index, key), file, (section, i, key))
            if section == "sriov" and isinstance(item, dict) and isinstance(item.get("vf"), list):
                objects[index]["vf"] = []
                for j, vf in enumerate(item["vf"]):
                    self._add_vf(file, index, i, j, vf)
            return
        target = objects[index]
        for key, value in item.items():
            if key == "vf" and section == "sriov" and isinstance(value, list):
                if not isinstance(target.get("vf"), list):
                    target["vf"] = []  # replaces an earlier wrong shape, as for sections
                self._set((section, index, "vf"), file, (section, i, "vf"))
                for j, vf in enumerate(value):
                    self._add_vf(file, index, i, j, vf)
            else:
                target[key] = value
                self._set((section, index, key), file, (section, i, key))

    def _add_vf(self, file: str, pf_index: int, file_pf: int, j: int, vf: Any) -> None:
        vfs: list[Any] = self.merged["sriov"][pf_index]["vf"]  # callers made it a list
        match = None
        key = _vf_key(vf)
        if key is not None:
            match = next(
                (n for n, o in enumerate(vfs) if _vf_key(o) == key),
                None,
            )
        if match is None or not isinstance(vf, dict):
            vfs.append(dict(vf) if isinstance(vf, dict) else vf)
            match = len(vfs) - 1
            self._set(("sriov", pf_index, "vf", match), file, ("sriov", file_pf, "vf", j))
        target = vfs[match]
        if key is not None:
            self._seen_in_file(
                file,
                ("sriov", pf_index, "vf", match),
                ("sriov", file_pf, "vf", j),
                f"VF {key} of this PF" if isinstance(key, int) else f"VFs {key!r} of this PF",
            )
        if isinstance(vf, dict):
            for key, value in vf.items():
                target[key] = value
                self._set(
                    ("sriov", pf_index, "vf", match, key), file, ("sriov", file_pf, "vf", j, key)
                )


def _vf_key(vf: Any) -> int | str | None:
    """What a later file names the same VF block by: its index, or its range's text
    with spaces and case dropped ("0 - 7" is "0-7")."""
    index = vf.get("index") if isinstance(vf, dict) else None
    if isinstance(index, bool):
        return None
    if isinstance(index, int):
        return index
    if isinstance(index, str):
        return "".join(index.split()).lower()
    return None


def _describe(identity: tuple[str, ...]) -> str:
    """('pci', '0000:3b:00.0') -> "pci=0000:3b:00.0", as status names a PF."""
    return "=".join(identity)


def _select_identity(select: dict[str, Any]) -> tuple[str, ...]:
    """A selector table as a key: each key's values as rdmad reads them, sorted."""
    return ("select", pfselect.identity(select))


def _identity(section: str, item: Any) -> tuple[str, ...] | None:
    """The key a later file uses to address the same object; None if unusable."""
    if not isinstance(item, dict):
        return None
    if section == "rxe":
        name = item.get("name")
        return ("name", name) if isinstance(name, str) else None
    pf = item.get("pf")
    select = item.get("select")
    if pf is None and isinstance(select, dict) and select:
        return _select_identity(select)
    if isinstance(pf, dict) and len(pf) == 1:
        ((kind, value),) = pf.items()
        if isinstance(value, str):
            value = value.strip()
            if kind in ("pci", "mac"):
                value = value.lower()
            if kind == "pci" and len(value) == 7:
                value = "0000:" + value
            return (str(kind), value)
    return None
