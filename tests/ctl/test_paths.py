"""rdmad-ctl finds the socket and the state directory in the daemon's config (issue 44,
item 5): the command line, then $RDMAD_SOCKET, then [api] socket / [daemon] state_dir
of --config (merged as the daemon merges drop-ins), then the defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rdmad import config
from rdmad.ctl.client import DEFAULT_SOCKET
from rdmad.ctl.offline import DEFAULT_STATE_DIR
from rdmad.ctl.paths import DEFAULT_CONFIG, resolve
from tests.ctl.conftest import ApiStub, ctl


def config_dir(tmp: Path, main: str, **dropins: str) -> Path:
    (tmp / "rdmad.toml").write_text(main)
    if dropins:
        (tmp / "rdmad.d").mkdir()
        for name, text in dropins.items():
            (tmp / "rdmad.d" / name).write_text(text)
    return tmp


def resolved(
    config: Path | str, socket: str | None = None, state_dir: str | None = None, **env: str
) -> tuple[argparse.Namespace, list[str]]:
    args = argparse.Namespace(command="status", socket=socket, state_dir=state_dir)
    args.config = str(config)
    warnings: list[str] = []
    resolve(args, env, warnings.append)
    return args, warnings


def test_status_asks_the_socket_the_config_names(api: ApiStub, tmp_path: Path) -> None:
    api.fixture("GET /v1/status", "status-converged.json")
    where = config_dir(tmp_path, f'[api]\nsocket = "{api.socket}"\n')
    r = ctl("status", "--config", str(where))
    assert (r.code, r.err) == (0, "")
    assert api.requests == [("GET", "/v1/status")]


def test_a_later_dropin_wins_key_by_key_and_hidden_names_are_not_read(tmp_path: Path) -> None:
    where = config_dir(
        tmp_path,
        '[api]\nsocket = "/run/a.sock"\n[daemon]\nstate_dir = "/srv/rdmad"\n',
        **{"10-site.toml": '[api]\nsocket = "/run/b.sock"\n', ".20-x.toml": "[api]\nsocket = 1\n"},
    )
    args, warnings = resolved(where)
    assert (args.socket, args.state_dir, warnings) == ("/run/b.sock", "/srv/rdmad", [])


def test_flag_then_environment_then_config(tmp_path: Path) -> None:
    where = config_dir(tmp_path, '[api]\nsocket = "/run/conf.sock"\n')
    assert resolved(where, socket="/run/flag.sock", RDMAD_SOCKET="/run/env.sock")[0].socket == (
        "/run/flag.sock"
    )
    assert resolved(where, RDMAD_SOCKET="/run/env.sock")[0].socket == "/run/env.sock"
    assert resolved(where)[0].socket == "/run/conf.sock"
    assert resolved(where, state_dir="/x")[0].state_dir == "/x"


def test_a_path_the_daemon_would_refuse_is_not_used_either(tmp_path: Path) -> None:
    """The daemon runs with the default for a relative or too long path (a config error,
    key by key); rdmad-ctl must look for it there too, and say why."""
    long_socket = "/run/" + "s" * 98 + ".sock"  # 108 bytes: one past sun_path
    where = config_dir(
        tmp_path,
        '[api]\nsocket = "/run/a.sock"\n[daemon]\nstate_dir = "/srv/rdmad"\n',
        **{"10-site.toml": f'[api]\nsocket = "{long_socket}"\n[daemon]\nstate_dir = "srv"\n'},
    )
    args, warnings = resolved(where)
    assert (args.socket, args.state_dir) == (DEFAULT_SOCKET, DEFAULT_STATE_DIR)
    assert warnings == [
        f"[api] socket in the config is invalid (a UNIX socket's path holds at most 107 "
        f"bytes, this one 108: {long_socket!r}): using the default, as rdmad does",
        "[daemon] state_dir in the config is invalid (must be an absolute path (a relative "
        "one depends on the working directory), not 'srv'): using the default, as rdmad does",
    ]
    assert config.start_settings(where).api.socket == DEFAULT_SOCKET  # the daemon's choice
    assert config.start_settings(where).daemon.state_dir == DEFAULT_STATE_DIR


def test_no_config_keys_means_the_defaults(tmp_path: Path) -> None:
    where = config_dir(tmp_path, '[daemon]\nsettle = "100ms"\n')
    args, warnings = resolved(where)
    assert (args.socket, args.state_dir, warnings) == (DEFAULT_SOCKET, DEFAULT_STATE_DIR, [])


@pytest.mark.parametrize(
    "text, why", [("[api\n", "not valid TOML"), (b"\xff\xfe", "not valid TOML")]
)
def test_a_config_that_cannot_be_read_is_said_and_not_guessed_from(
    tmp_path: Path, text: str | bytes, why: str
) -> None:
    # The main file names a socket, the drop-in after it is broken: the drop-in might
    # have moved it, so neither is taken.
    where = config_dir(tmp_path, '[api]\nsocket = "/run/a.sock"\n', **{"10-x.toml": ""})
    broken = where / "rdmad.d" / "10-x.toml"
    broken.write_bytes(text if isinstance(text, bytes) else text.encode())
    args, warnings = resolved(where)
    assert args.socket == DEFAULT_SOCKET
    [warning] = warnings
    assert str(broken) in warning and why in warning and "defaults" in warning


def test_a_missing_config_given_is_said_the_default_one_is_not(tmp_path: Path) -> None:
    assert resolved(tmp_path / "nope")[1] == [
        f"no config at {tmp_path / 'nope'}: the socket and state directory are the defaults"
    ]
    if not Path(DEFAULT_CONFIG).exists():
        assert resolved(DEFAULT_CONFIG)[1] == []


def test_doctor_and_guard_do_not_read_it(tmp_path: Path) -> None:
    for command in ("doctor", "guard"):
        args = argparse.Namespace(command=command, socket=None, state_dir=None)
        args.config = str(tmp_path / "nope")
        warnings: list[str] = []
        resolve(args, {}, warnings.append)
        assert (args.socket, args.state_dir, warnings) == (DEFAULT_SOCKET, DEFAULT_STATE_DIR, [])
