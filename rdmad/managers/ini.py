"""The ini-style files systemd (.link, .network, drop-ins) and NetworkManager (keyfiles)
read: ``[Section]`` headers and ``Key=Value`` lines, in order, nothing merged (a key set
twice, or reset by an empty value, means something to each reader).

systemd joins a line ending in a backslash with the next and takes ``#`` and ``;`` as
comments; GLib's keyfile (NetworkManager) has ``#`` comments only and no continuation.
A line that is neither is an error naming its line: rdmad then cannot tell what the file
declares, which the callers treat as "may apply"."""

from __future__ import annotations

from typing import NamedTuple


class ParseError(ValueError):
    pass


class Entry(NamedTuple):
    section: str
    key: str
    value: str


def parse(text: str, *, systemd: bool) -> list[Entry]:
    entries: list[Entry] = []
    section: str | None = None
    comments = "#;" if systemd else "#"
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        number = i + 1
        line = lines[i].strip()
        i += 1
        if systemd:
            while line.endswith("\\") and i < len(lines):
                line = line[:-1] + " " + lines[i].strip()
                i += 1
        if not line or line[0] in comments:
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise ParseError(f"line {number}: a section header without its closing ]")
            section = line[1:-1].strip()
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise ParseError(f"line {number}: neither a [section] nor a Key=Value line")
        if section is None:
            raise ParseError(f"line {number}: {key.strip()}= before any [section]")
        entries.append(Entry(section, key.strip(), value.strip()))
    return entries


def sections(entries: list[Entry]) -> set[str]:
    return {e.section for e in entries}


def values(entries: list[Entry], section: str, key: str) -> list[str]:
    """Every value of one key in one section, in file order."""
    return [e.value for e in entries if e.section == section and e.key == key]


def last(entries: list[Entry], section: str, key: str) -> str | None:
    found = values(entries, section, key)
    return found[-1] if found else None
