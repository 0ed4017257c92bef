"""NetworkManager's connection profiles (keyfiles, nm-settings-keyfile(5)) with an
``[sriov]`` setting: NetworkManager then sets the VF count (``total-vfs``, also when 0)
and VF attributes (``vfs``) whenever it activates the profile on a device, and resets
them when it deactivates it.

Profiles live in /etc, /run and /usr/lib ``NetworkManager/system-connections/`` (in /run
and /usr/lib only ``*.nmconnection`` files count). Which device a profile is for
(``profile_match()``): ``[connection] interface-name`` (the exact name), ``[ethernet]`` or
``[infiniband] mac-address`` (the permanent address), and ``[match]`` ``interface-name``,
``driver``, ``path`` (lists of shell globs; ``|`` optional, ``&`` mandatory, ``!``
negated and mandatory, as nm-settings(5) says). A profile that names no device may be
activated on any of them, so it may apply.
"""

from __future__ import annotations

import fnmatch

from rdmad.managers import ini
from rdmad.managers.facts import NO, YES, Claim, Files, Match, PfFacts, Verdict, both
from rdmad.managers.networkd import normal_mac

MANAGER = "NetworkManager"
DIRS = (
    "etc/NetworkManager/system-connections",
    "run/NetworkManager/system-connections",
    "usr/lib/NetworkManager/system-connections",
)
SUFFIX = ".nmconnection"
# Names NetworkManager skips in /etc (editor and package manager leftovers).
_IGNORED = ("~", ".swp", ".bak", ".orig", ".rej", ".tmp", ".rpmnew", ".rpmsave", ".pacnew")


def load(files: Files) -> list[tuple[str, list[ini.Entry] | str, bool]]:
    """(absolute path, entries or why it cannot be parsed, mentions sriov) of each
    profile. Raises CannotRead when a directory or file that is there cannot be read."""
    out: list[tuple[str, list[ini.Entry] | str, bool]] = []
    for d in DIRS:
        for name in files.names(d):
            if not _counts(d, name):
                continue
            text = files.text(f"{d}/{name}")
            if text is None:
                continue
            path = f"/{d}/{name}"
            try:
                parsed: list[ini.Entry] | str = ini.parse(text, systemd=False)
            except ini.ParseError as exc:
                parsed = f"{path}: {exc}"
            out.append((path, parsed, "sriov" in text.lower()))
    return out


def _counts(d: str, name: str) -> bool:
    if name.startswith(".") or ".dpkg-" in name:
        return False
    if name.endswith(SUFFIX):
        return True
    return d.startswith("etc/") and not name.endswith(_IGNORED)


def claims(profiles: list[tuple[str, list[ini.Entry] | str, bool]], pf: PfFacts) -> list[Claim]:
    out = []
    for path, parsed, mentions in profiles:
        if isinstance(parsed, str):
            if mentions:
                out.append(Claim(MANAGER, path, "mentions sriov", False, parsed))
            continue
        if "sriov" not in ini.sections(parsed):
            continue
        verdict = profile_match(parsed, pf)
        if verdict.match is Match.NO:
            continue
        out.append(Claim(MANAGER, path, _what(parsed), verdict.match is Match.YES, verdict.why))
    return out


def _what(entries: list[ini.Entry]) -> str:
    parts = [f"[sriov] {e.key}={e.value}" for e in entries if e.section == "sriov"]
    return "; ".join(parts) or "[sriov]"


def profile_match(entries: list[ini.Entry], pf: PfFacts) -> Verdict:
    result = YES
    bound = False
    name = ini.last(entries, "connection", "interface-name")
    if name:
        bound = True
        result = both(result, _maybe("interface-name", "the PF has no netdev now")
                      if pf.name is None else (YES if name == pf.name else NO))  # fmt: skip
    for section in ("ethernet", "infiniband"):
        mac = ini.last(entries, section, "mac-address")
        if mac:
            bound = True
            result = both(result, _mac(section, mac, pf))
    for key, value in (
        ("interface-name", pf.names()),
        ("driver", (pf.driver,) if pf.driver else ()),
        ("path", (pf.path,)),
    ):
        raw = ini.last(entries, "match", key)
        if raw:
            bound = True
            result = both(result, _match_list(key, raw, value))
    if ini.last(entries, "match", "kernel-command-line"):
        bound = True
        result = both(
            result, _maybe("match.kernel-command-line", "a condition rdmad does not evaluate")
        )
    if not bound:
        return _maybe("profile", "it names no device: NetworkManager may activate it on any")
    return result


def _maybe(key: str, why: str) -> Verdict:
    return Verdict(Match.MAYBE, f"{key}: {why}")


def _mac(section: str, mac: str, pf: PfFacts) -> Verdict:
    wanted = normal_mac(mac)
    if wanted is None:
        return _maybe(f"{section}.mac-address", f"{mac!r} is not a MAC address rdmad can read")
    # The permanent address; a device without one is matched by its current address.
    seen = pf.perm_mac or pf.mac
    if seen is None:
        return _maybe(f"{section}.mac-address", "the PF's MAC address is not known")
    return YES if normal_mac(seen) == wanted else NO


def _match_list(key: str, raw: str, values: tuple[str, ...]) -> Verdict:
    """One ``[match]`` list against the PF's values (any may fit)."""
    if not values:
        return _maybe(f"match.{key}", f"the PF's {key} is not known")
    optional: list[bool] = []
    for element in (e.strip() for e in raw.split(";")):
        if not element:
            continue
        mandatory = element[0] in "&!"
        element = element.lstrip("|&")
        negate = element.startswith("!")
        element = element.removeprefix("!").removeprefix("\\")
        hit = any(fnmatch.fnmatchcase(v, element) for v in values) != negate
        if mandatory:
            if not hit:
                return NO
        else:
            optional.append(hit)
    return YES if not optional or any(optional) else NO
