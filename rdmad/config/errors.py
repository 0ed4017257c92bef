"""What a config problem looks like: the file, the key path in it, and what is wrong.

Its own module because every stage names problems the same way (a file that cannot be
read, a key the merge put somewhere, a value validation refused) and ``load()`` raises
them all at once, never stopping at the first: a TOML syntax error in one file does not
hide schema errors in another.
"""

from __future__ import annotations

import msgspec


class ConfigError(msgspec.Struct, frozen=True):
    file: str
    path: str
    message: str
    line: int | None = None  # where the key is in the file, when it can be told (lines.py)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        where = f"{where}: {self.path}" if self.path else where
        return f"{where}: {self.message}"


class ConfigInvalid(Exception):
    def __init__(self, errors: list[ConfigError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))
