"""rdmad-ctl's exit codes: what scripts test for, documented in `--help` and README.md."""

from __future__ import annotations

OK = 0  # converged (status) / the request succeeded
FAIL = 1  # not converged, blocked, degraded; or the request failed
USAGE = 2  # bad arguments (argparse's own code)
NOT_RUNNING = 3  # nothing listens on the socket: rdmad is not running
DENIED = 4  # the socket or the API refused us (not root, not in the API's group)
NO_ANSWER = 5  # rdmad listens but did not answer in time: hung (a liveness probe's "dead")
INTERRUPTED = 130  # Ctrl-C during a one-shot command (watch exits 0 on Ctrl-C)

HELP = """\
exit codes:
  0  converged (status), or the request succeeded
  1  not converged (status, reload, reconcile: the daemon says `converged`
     is false: an object pending, blocked, degraded, a VF in use that
     drifted); the config is invalid (config, reload: the daemon keeps the
     last good one); or the request failed (an error answer, an answer that
     is not what the API promises). Attributes a driver refuses
     (unsupported-by-driver) are listed but do not make this 1.
  2  usage error (bad arguments)
  3  rdmad is not running (no socket, or nothing listens on it)
  4  permission denied: only root and the API's read group (default `rdmad`,
     [api] read_group) may read; reload and reconcile need root or
     [api] write_group
  5  rdmad did not answer within --timeout (it listens but is stuck): a
     liveness check treats 3 and 5 as dead, 0 and 1 as alive
"""
