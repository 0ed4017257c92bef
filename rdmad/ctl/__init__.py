"""rdmad-ctl: the operator's client for the daemon's local UNIX-socket API (docs/API.md).

Standard library only, and only what a command needs: it must start within tens
of milliseconds of a bare ``python3`` on a loaded node, so it imports none of the
daemon's stack (an import-linter contract and tests/ctl hold this).

    args.py      the command line and its help
    client.py    HTTP over the UNIX socket; failures as CtlError with an exit code
    commands.py  one function per command
    render/      tables and lines from the API's documents, one module per document
    offline.py   the saved state file, for when the daemon is down

The exit codes and the JSON error object are rdmad's, shared with `rdmad`
(rdmad/exits.py).
"""

from __future__ import annotations

import os
import sys

from rdmad import exits

TYPE_CHECKING = False  # typing costs 4 ms to import; annotations are strings anyway
if TYPE_CHECKING:
    from rdmad.ctl.commands import Ctx


def main(argv: list[str] | None = None) -> int:
    from rdmad.ctl.commands import Ctx

    return run(argv, Ctx.real())


def run(argv: list[str] | None, ctx: Ctx) -> int:
    """Parse, run one command, turn every failure into words and an exit code."""
    from rdmad.ctl.args import parser
    from rdmad.ctl.client import Client, CtlError
    from rdmad.ctl.commands import COMMANDS

    argv = sys.argv[1:] if argv is None else argv
    p = parser(argv)
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help(sys.stderr)
        return exits.USAGE
    from rdmad.ctl.paths import resolve

    resolve(args, os.environ, ctx.warn)
    try:
        code = COMMANDS[args.command](args, ctx, Client(args.socket, args.timeout))
        ctx.out.flush()  # here, where a reader that went away is handled, not at exit
        return code
    except CtlError as exc:
        if exc.exit_code == exits.NOT_RUNNING:
            from rdmad.ctl.commands import not_running_hints

            ctx.warn(str(exc), *not_running_hints(exc))
        else:
            ctx.warn(str(exc))
        return _failed(args, ctx, exc.exit_code, str(exc))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        # An answer of the wrong shape reached the printing: say so, never a traceback.
        why = f"rdmad's answer is not what this rdmad-ctl expects ({type(exc).__name__}: {exc})"
        ctx.warn(f"{why}; is it the same version as the daemon? `--json` shows the answer as it is")
        return _failed(args, ctx, exits.FAIL, why)
    except KeyboardInterrupt:
        return _failed(args, ctx, exits.INTERRUPTED, "interrupted")
    except BrokenPipeError:
        # The reader went away (`rdmad-ctl history | head`): stop quietly; point stdout
        # at /dev/null so the interpreter's final flush does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return exits.OK if args.command == "watch" else exits.FAIL


def _failed(args: object, ctx: Ctx, code: int, message: str) -> int:
    """With --json, the failure as the JSON error object on stdout too (a script reads
    stdout); the words went to stderr already. ``code`` is the exit code."""
    if getattr(args, "json", False):
        ctx.json(exits.error_doc(code, message))
        ctx.out.flush()
    return code
