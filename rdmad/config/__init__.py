"""Config files -> ``Desired``, with every error named by file and key path.

* ``files``: which files make up the config (``DIR/rdmad.toml`` plus
  ``DIR/rdmad.d/*.toml`` in name order) and each one as TOML, refusing what cannot be
  a config file or could be changed by someone other than root;
* ``merge``: the documents merged by object identity, each key's origin remembered;
* ``validation``: the merged config against the schema and the rules across objects;
* ``errors``: ``ConfigError`` (file, key path, message) and ``ConfigInvalid``.

This module puts them together for the callers: ``load()`` for the daemon,
``start_settings()`` for the sections the daemon sets itself up with, even when the
config as a whole is invalid, and ``effective()`` to show the merged config with where
each value came from. Errors are collected, never stopping at the first.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from rdmad.config.errors import ConfigError, ConfigInvalid
from rdmad.config.files import DEFAULT_DIR, discover, display, read_all, read_document
from rdmad.config.lines import with_lines
from rdmad.config.merge import Merger
from rdmad.config.validation import parse
from rdmad.model import ApiSpec, DaemonSpec, Desired, MetricsSpec
from rdmad.model.validation import Loc, SpecError, render, validate

__all__ = [
    "DEFAULT_DIR",
    "ConfigError",
    "ConfigInvalid",
    "Effective",
    "LoadedConfig",
    "ValueOrigin",
    "effective",
    "load",
    "parse",
    "start_settings",
]

_SpecT = TypeVar("_SpecT", DaemonSpec, MetricsSpec, ApiSpec)


class LoadedConfig(msgspec.Struct, frozen=True):
    desired: Desired
    files: tuple[str, ...]


def load(location: Path = DEFAULT_DIR) -> LoadedConfig:
    """Read, merge and validate; raise ConfigInvalid with all errors.

    Raises nothing else for anything found on disk: a file that cannot be read,
    vanishes after listing, is not UTF-8 or is too big is a ConfigError like a
    bad value, so the daemon keeps its last good config instead of exiting.
    """
    files, docs, errors = read_all(location)
    desired, more = parse(docs)
    errors.extend(more)
    if errors or desired is None:
        raise ConfigInvalid(with_lines(errors))
    return LoadedConfig(desired, tuple(display(p) for p in files))


def start_settings(location: Path = DEFAULT_DIR) -> Desired:
    """The settings the daemon sets itself up with once, even when the config as a whole
    is invalid: ``[daemon]`` (logging, the state directory), ``[api]`` and ``[metrics]``;
    the other sections empty.

    Chosen before the agent loads (and perhaps rejects) the config: a broken drop-in must
    not send the state file to the default directory, drop the log level the admin set,
    take the API (the way to see why) away or switch metrics off. The files are read
    once for all three sections: what the daemon starts with and what a reload compares
    with (``rdmad.config.restart``) are one reading.
    """
    merged = _merge_readable(location).merged
    return Desired(
        daemon=_section_settings(merged, "daemon", DaemonSpec),
        api=_section_settings(merged, "api", ApiSpec),
        metrics=_section_settings(merged, "metrics", MetricsSpec),
    )


def _section_settings(merged: dict[str, Any], section: str, spec: type[_SpecT]) -> _SpecT:
    """One top-level table's settings from every file that reads, merged as usual: each
    key of ``[section]`` that is valid on its own; the rest take their defaults. The
    errors are the agent's to report (it loads the config itself), so none are
    returned here."""
    table = merged.get(section)
    if not isinstance(table, dict):
        return spec()
    good = {}
    for key, value in table.items():
        try:
            validate(spec, {key: value})
        except SpecError:
            continue
        good[key] = value
    return validate(spec, good)


def _merge_readable(location: Path) -> Merger:
    files, _ = discover(location)
    merger = Merger()
    for path in files:
        doc, _problem = read_document(path)
        if doc is not None:
            merger.add(display(path), doc)
    return merger


class ValueOrigin(msgspec.Struct, frozen=True):
    """One value of the merged config and where it came from."""

    key: str  # its path in the merged config, e.g. "sriov[0].numvfs"
    value: Any
    file: str
    file_key: str  # its path in that file (drop-ins number their own [[sriov]] entries)


class Effective(msgspec.Struct, frozen=True):
    """The config as merged from its files (valid or not), for showing, never for running."""

    merged: dict[str, Any]
    values: tuple[ValueOrigin, ...]
    files: tuple[str, ...]
    errors: tuple[ConfigError, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


def effective(location: Path = DEFAULT_DIR) -> Effective:
    """The merged config at ``location`` with the file and key each value came from,
    and every error ``load()`` would report. Reads only; changes nothing."""
    files, docs, errors = read_all(location)
    merger = Merger()
    for file, doc in docs:
        merger.add(file, doc)
    _desired, more = parse(docs)
    errors.extend(more)
    values = []
    for loc, value in _leaves(merger.merged, ()):
        file, file_key = merger.origin(loc)
        values.append(ValueOrigin(render(loc), value, file, file_key))
    shown = tuple(display(p) for p in files)
    return Effective(merger.merged, tuple(values), shown, tuple(with_lines(errors)))


def _leaves(value: Any, loc: Loc) -> Iterable[tuple[Loc, Any]]:
    """Every value that is not a table or an array of tables, with its location."""
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _leaves(sub, (*loc, key))
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for i, sub in enumerate(value):
            yield from _leaves(sub, (*loc, i))
    else:
        yield loc, value
