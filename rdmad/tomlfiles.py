"""rdmad's config files as raw TOML documents, in the order rdmad reads them, with the
standard library only.

For the readers that may not import the config schema (rdmad-ctl must start fast, the
doctor must work where the daemon's dependencies are broken): the main file
``rdmad.toml`` of a directory, then ``rdmad.d/*.toml`` in name order, hidden names
(editor locks, temp files) left out, as ``rdmad.config.files`` lists them. What cannot
be read is said, never taken for "nothing declared": the caller decides what the
missing part means.
"""

from __future__ import annotations

import os
from typing import Any

from rdmad.tomlcompat import tomllib

MAIN_FILE = "rdmad.toml"
DROPIN_DIR = "rdmad.d"


def config_files(where: str) -> tuple[list[str], str | None]:
    """The files of the config at ``where`` (a directory or one file), and why not all
    could be listed (None when they could)."""
    if os.path.isdir(where):
        main = os.path.join(where, MAIN_FILE)
        files = [main] if os.path.lexists(main) else []
        drop = os.path.join(where, DROPIN_DIR)
        if os.path.lexists(drop):
            try:
                names = sorted(os.listdir(drop))
            except OSError as exc:
                return files, f"{drop}: {exc.strerror}"
            files += [
                os.path.join(drop, n)
                for n in names
                if n.endswith(".toml") and not n.startswith(".")
            ]
        return files, None
    if os.path.lexists(where):
        return [where], None
    return [], f"{where} does not exist"


def read_documents(where: str) -> tuple[list[tuple[str, dict[str, Any]]], str | None]:
    """Each file of the config at ``where`` parsed, in order; on the first file that
    cannot be read or parsed, the documents before it and why."""
    files, note = config_files(where)
    docs: list[tuple[str, dict[str, Any]]] = []
    if note is not None:
        return docs, note
    for path in files:
        try:
            with open(path, "rb") as fh:
                docs.append((path, tomllib.load(fh)))
        except OSError as exc:
            return docs, f"{path}: {exc.strerror}"
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            return docs, f"{path}: not valid TOML: {exc}"
    return docs, None
