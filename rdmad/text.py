"""Text that reaches a terminal or the journal: untrusted characters made visible.

Much of what rdmad prints comes from others: a process's ``comm`` (any user sets it
with prctl(PR_SET_NAME) or by writing /proc/self/comm), netdev and RDMA device
names, libvirt domain names, config values quoted in errors, the words of modprobe
and the kernel. ESC, BEL and the C1 controls in them would drive the operator's
terminal (retitle it, rewrite lines already shown, hide text); a newline would forge
a log line or, in sd_notify's ``STATUS=``, a second assignment.

``safe()`` is applied where text leaves rdmad for people (rdmad-ctl's tables and
lines, the doctor, the guard's refusal and its journal line, the log renderers for
terminals and logfmt, sd_notify's status line), never to the data: JSON output
carries the exact string (JSON escapes control characters itself).

Standard library only: rdmad-ctl, the doctor and the guard import it.
"""

from __future__ import annotations


def safe(text: str) -> str:
    """``text`` with every character that is not printable written as an escape.

    Not printable (``str.isprintable``): C0 controls (tab and newline too), DEL, C1
    controls, format characters such as the bidirectional overrides, separators other
    than the space, surrogates, private-use and unassigned code points. Printable
    UTF-8 (accents, CJK, emoji) is kept. Escapes are Python's: ``\\n``, ``\\x1b``,
    ``\\u202e``, ``\\U000f0000``. A backslash already in the text is left as it is: the goal is a
    terminal that shows what is there, not a reversible encoding (JSON is that).
    """
    if text.isprintable():
        return text  # the common case: one C-level scan, no copy
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def safe_lines(text: str) -> str:
    """``safe()`` per line, newlines kept: for messages that are several lines by
    design (the guard's refusal, a traceback). Other line breaks (CR, VT, FF, U+2028)
    are escaped."""
    return "\n".join(safe(line) for line in text.split("\n"))


_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(c: str) -> str:
    short = _SHORT.get(c)
    if short is not None:
        return short
    n = ord(c)
    if n < 0x100:
        return f"\\x{n:02x}"
    if n < 0x10000:
        return f"\\u{n:04x}"
    return f"\\U{n:08x}"


__all__ = ["safe", "safe_lines"]
