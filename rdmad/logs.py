"""structlog set-up for the daemon: logfmt or JSON, journald-aware, stdlib logs included.

Under journald (``JOURNAL_STREAM`` names our stderr) lines carry no timestamp
(journald stamps them; two stamps per line is noise) and start with a ``<N>``
syslog priority prefix, which journald turns into the entry's PRIORITY so
``journalctl -p warning`` works. Stdlib loggers (``rdmad.kernel``) go through the
same renderer, so every line has one format.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

import structlog

from rdmad.text import safe, safe_lines

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
# syslog priorities for sd-daemon(3) "<N>" prefixes
_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def under_journald(stream: TextIO | None = None) -> bool:
    """True when stderr is connected to the journal (systemd sets JOURNAL_STREAM=dev:ino)."""
    value = os.environ.get("JOURNAL_STREAM", "")
    if ":" not in value:
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError):
        return False
    dev, _, ino = value.partition(":")
    return f"{st.st_dev}:{st.st_ino}" == f"{dev}:{ino}"


class _JournalFormatter(structlog.stdlib.ProcessorFormatter):
    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        return f"<{prio}>" + super().format(record)


# Values the renderers print as they are; everything else is shown through str() or repr().
_PLAIN = (int, float, bool, type(None))


def escape_text(_logger: Any, _name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """A structlog processor: every value made safe for a terminal and the journal
    (``rdmad.text.safe``): log lines quote netdev names, holders' ``comm``, config values
    and the kernel's words, which others choose. A traceback keeps its lines."""
    out: dict[str, Any] = {}
    for key, value in event_dict.items():
        if isinstance(value, str):
            value = safe_lines(value) if key in ("exception", "stack") else safe(value)
        elif not isinstance(value, _PLAIN):
            text = str(value)  # what logfmt prints; the console's repr() escapes already
            if not text.isprintable():
                value = safe(text)
        out[key] = value
    return out


def configure(
    level: str = "info",
    fmt: str = "auto",
    stream: TextIO | None = None,
    journald: bool | None = None,
) -> None:
    """Route structlog and stdlib logging to ``stream`` (stderr) in one format.

    ``fmt``: logfmt, json, console, or auto (logfmt; console on a terminal).
    """
    stream = stream or sys.stderr
    if journald is None:
        journald = under_journald(stream)
    if fmt == "auto":
        fmt = "console" if stream.isatty() and not journald else "logfmt"
    pre: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
    ]
    if not journald:
        pre.append(structlog.processors.TimeStamper(fmt="iso", utc=True))
    renderer: Any
    escape: list[Any] = [escape_text]  # text lines go to a terminal or the journal
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
        escape = []  # JSON escapes control characters itself; the strings stay exact
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        renderer = structlog.processors.LogfmtRenderer(
            key_order=["timestamp", "level", "event", "logger"], drop_missing=True
        )
    formatter_cls = _JournalFormatter if journald else structlog.stdlib.ProcessorFormatter
    formatter = formatter_cls(
        foreign_pre_chain=pre,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            *escape,
            renderer,
        ],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    numeric = LEVELS.get(level, logging.INFO)
    root.setLevel(numeric)
    # The agent logs one structured event per kernel write (old -> new, reason);
    # the host's own per-write lines would say the same again, so below debug
    # only its errors pass.
    logging.getLogger("rdmad.kernel").setLevel(
        logging.DEBUG if numeric <= logging.DEBUG else logging.ERROR
    )
    structlog.configure(
        processors=[*pre, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        cache_logger_on_first_use=True,
    )
