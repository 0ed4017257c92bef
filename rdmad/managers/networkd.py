"""systemd's network files: ``.link`` (applied by systemd-udevd when a netdev appears:
``SR-IOVVirtualFunctions=`` in [Link] and [SR-IOV] sections) and ``.network`` (applied by
systemd-networkd: [SR-IOV] sections).

How systemd finds them (systemd.link(5), systemd.network(5)): the files of all the
network directories are sorted together by name; a name in a directory of higher
priority (/etc, then /run, then /usr/local/lib, /usr/lib, /lib) hides the same name
below it, and an empty file or a symlink to /dev/null of that name masks it. Drop-ins
(``NAME.d/*.conf`` in any of the directories, the same masking by name) are read after
the file. Of the files whose [Match] fits a netdev, the first by name is the one applied:
a later file never applies to it.

[Match] (``match()``): each key set is a condition and all must hold; a key's values are
a list (whitespace-separated, repeated assignments add, an empty one resets it, a
leading ``!`` inverts the list), any of which may fit (shell globs for names, drivers,
types and paths). Conditions rdmad cannot evaluate (the host, the kernel command line,
credentials...) may hold: the file then counts as one that may apply, and says why.
"""

from __future__ import annotations

import fnmatch
from typing import NamedTuple

from rdmad.managers import ini
from rdmad.managers.facts import NO, YES, Claim, Files, Match, PfFacts, Verdict, both

DIRS = (
    "etc/systemd/network",
    "run/systemd/network",
    "usr/local/lib/systemd/network",
    "usr/lib/systemd/network",
    "lib/systemd/network",
)
MANAGER = {".link": "systemd-udevd", ".network": "systemd-networkd"}


class NetFile(NamedTuple):
    """One .link or .network file as systemd reads it (with its drop-ins)."""

    name: str  # "10-pf.link"
    paths: tuple[str, ...]  # absolute: the file, then its drop-ins
    entries: tuple[ini.Entry, ...] = ()
    error: str | None = None  # why it cannot be parsed (with the path)
    sriov_text: bool = False  # its text mentions SR-IOV (for one that cannot be parsed)

    @property
    def suffix(self) -> str:
        return ".link" if self.name.endswith(".link") else ".network"

    def sriov(self) -> str | None:
        """What it declares of SR-IOV, in its own words; None when nothing."""
        parts = []
        count = ini.last(list(self.entries), "Link", "SR-IOVVirtualFunctions")
        if count:
            parts.append(f"SR-IOVVirtualFunctions={count}")
        vfs = ini.values(list(self.entries), "SR-IOV", "VirtualFunction")
        if vfs:
            parts.append("[SR-IOV] VirtualFunction=" + ", ".join(vfs))
        elif any(e.section == "SR-IOV" for e in self.entries):
            parts.append("[SR-IOV]")
        return "; ".join(parts) or None


def load(files: Files) -> list[NetFile]:
    """The .link and .network files systemd would read, by name. Raises CannotRead when
    a directory or file that is there cannot be read."""
    chosen: dict[str, str] = {}
    for d in DIRS:
        for name in files.names(d):
            if name.endswith((".link", ".network")) and name not in chosen:
                chosen[name] = d
    out = []
    for name in sorted(chosen):
        rel = f"{chosen[name]}/{name}"
        text = files.text(rel)
        if text is None or text == "" or files.link_name(rel) == "null":
            continue  # masked (or gone since the listing)
        paths = [rel, *_dropins(files, name)]
        bodies = [text] + [files.text(p) or "" for p in paths[1:]]
        entries: list[ini.Entry] = []
        error = None
        for path, body in zip(paths, bodies, strict=True):
            try:
                entries += ini.parse(body, systemd=True)
            except ini.ParseError as exc:
                error = f"/{path}: {exc}"
                break
        out.append(
            NetFile(
                name,
                tuple(f"/{p}" for p in paths),
                tuple(entries),
                error,
                any("sr-iov" in b.lower() for b in bodies),
            )
        )
    return out


def _dropins(files: Files, name: str) -> list[str]:
    chosen: dict[str, str] = {}
    for d in DIRS:
        for conf in files.names(f"{d}/{name}.d"):
            if conf.endswith(".conf") and conf not in chosen:
                chosen[conf] = f"{d}/{name}.d/{conf}"
    return [chosen[c] for c in sorted(chosen)]


def claims(netfiles: list[NetFile], pf: PfFacts) -> list[Claim]:
    """The files that declare SR-IOV and apply, or may apply, to ``pf``: of each kind,
    those up to the first that surely applies (the one systemd applies)."""
    out: list[Claim] = []
    for suffix in (".link", ".network"):
        for nf in (f for f in netfiles if f.suffix == suffix):
            manager = MANAGER[suffix]
            if nf.error is not None:
                if nf.sriov_text:
                    out.append(Claim(manager, nf.paths[0], "mentions SR-IOV", False, f"{nf.error}"))
                continue
            verdict = match(list(nf.entries), pf, suffix)
            what = nf.sriov()
            if what is not None and verdict.match is not Match.NO:
                file = ", ".join(nf.paths)
                out.append(Claim(manager, file, what, verdict.match is Match.YES, verdict.why))
            if verdict.match is Match.YES:
                break  # systemd applies this one; later files never apply to the PF
    return out


# Conditions about the host, not the netdev: not evaluated, so they may hold.
_HOST_KEYS = frozenset(
    {"Host", "Virtualization", "KernelCommandLine", "KernelVersion", "Credential",
     "Architecture", "Firmware"}
)  # fmt: skip


def match(entries: list[ini.Entry], pf: PfFacts, suffix: str) -> Verdict:
    """Whether a file's [Match] fits the PF's netdev."""
    lists: dict[str, tuple[bool, list[str]]] = {}
    for e in entries:
        if e.section != "Match":
            continue
        if e.value == "":
            lists.pop(e.key, None)  # an empty assignment resets the list
            continue
        invert, words = lists.get(e.key, (False, []))
        value = e.value
        if not words and value.startswith("!"):
            invert, value = True, value[1:]
        lists[e.key] = (invert, words + value.split())
    result = YES
    for key, (invert, words) in lists.items():
        verdict = _condition(key, words, pf, suffix)
        if invert and verdict.match is not Match.MAYBE:
            verdict = NO if verdict.match is Match.YES else YES
        result = both(result, verdict)
    return result


def _condition(key: str, words: list[str], pf: PfFacts, suffix: str) -> Verdict:
    def maybe(why: str) -> Verdict:
        return Verdict(Match.MAYBE, f"[Match] {key}={' '.join(words)}: {why}")

    def globs(value: str | None, what: str) -> Verdict:
        if value is None:
            return maybe(f"the PF's {what} is not known")
        return YES if any(fnmatch.fnmatchcase(value, w) for w in words) else NO

    if key in ("MACAddress", "PermanentMACAddress"):
        wanted = {normal_mac(w) for w in words}
        if None in wanted:
            return maybe("not a list of MAC addresses rdmad can read")
        # A .link applies when the netdev appears, when its address is the permanent one.
        seen = {pf.perm_mac} if key == "PermanentMACAddress" else {pf.mac, pf.perm_mac}
        seen = {normal_mac(s) for s in seen if s} - {None}
        if not seen:
            return maybe("the PF's MAC address is not known")
        return YES if wanted & seen else NO
    if key == "Driver":
        return globs(pf.driver, "driver")
    if key == "Path":
        return globs(pf.path, "udev path")
    if key == "Type":
        return globs(pf.link_type, "link type")
    if key == "OriginalName" and suffix == ".link":
        if words == ["*"]:
            return YES
        return globs(pf.original_name, "name before udev renamed it")
    if key == "Name" and suffix == ".network":
        names = pf.names()
        if not names:
            return maybe("the PF has no netdev now")
        return YES if any(fnmatch.fnmatchcase(n, w) for n in names for w in words) else NO
    if key == "Property":
        if pf.udev is None:
            return maybe("the PF's udev properties are not known")
        for w in words:  # every property given must fit
            prop, eq, pattern = w.partition("=")
            value = pf.udev.get(prop)
            if value is None or (eq and not fnmatch.fnmatchcase(value, pattern)):
                return NO
        return YES
    if key == "Kind":
        # A PCI function's own netdev has no kind (kinds are bond, vlan, veth...).
        return NO
    if key in _HOST_KEYS:
        return maybe("a condition on the host that rdmad does not evaluate")
    return maybe("a key rdmad does not evaluate")


def normal_mac(text: str) -> str | None:
    """A MAC address as lower-case, colon-separated hex (systemd also takes dashes and
    dotted groups of four); None when it is none."""
    t = text.strip().lower()
    if "." in t:
        hexdigits = t.replace(".", "")
        if len(hexdigits) != 12:
            return None
        t = ":".join(hexdigits[i : i + 2] for i in range(0, 12, 2))
    parts = t.replace("-", ":").split(":")
    if len(parts) < 6 or any(len(p) != 2 for p in parts):
        return None
    try:
        [int(p, 16) for p in parts]
    except ValueError:
        return None
    return ":".join(parts)
