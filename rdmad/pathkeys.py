"""What a path in the config must be: the one rule the daemon's config check
(``rdmad.model.desired``: ``[daemon] state_dir``, ``[api] socket``, ``[metrics]
textfile_dir``) and rdmad-ctl (``rdmad.ctl.paths``, which reads the socket and state
directory from the same files) both apply, so that both drop the same bad value and
fall back to the same default.

* Absolute: a relative path would be taken from the daemon's working directory (``/``
  under systemd), or from the operator's for rdmad-ctl, which are not the same place.
* No NUL byte: the kernel's path strings end at one.
* A UNIX socket's path fits ``sun_path`` (108 bytes with its terminating NUL); a longer
  one cannot be bound, and the API would be missing with only a log line to say why.

Standard library only: rdmad-ctl imports it.
"""

from __future__ import annotations

SUN_PATH_MAX = 107  # bytes of a UNIX socket's path: sun_path is 108, one for the NUL


def path_problem(value: str) -> str | None:
    """Why ``value`` cannot be a path in the config; None when it can."""
    if not value.startswith("/"):
        return (
            f"must be an absolute path (a relative one depends on the working directory), "
            f"not {value!r}"
        )
    if "\0" in value:
        return f"must not hold a NUL byte: {value!r}"
    return None


def socket_path_problem(value: str) -> str | None:
    """Why ``value`` cannot be the API socket's path; None when it can."""
    problem = path_problem(value)
    if problem is not None:
        return problem
    size = len(value.encode())
    if size > SUN_PATH_MAX:
        return (
            f"a UNIX socket's path holds at most {SUN_PATH_MAX} bytes, this one {size}: {value!r}"
        )
    return None
