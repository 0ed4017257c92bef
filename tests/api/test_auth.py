"""SO_PEERCRED: real clients under another uid (curl run as nobody through setpriv).

Needs root (another uid, groupadd); CI runs as root, so there these fail rather
than skip when root is missing (conftest.require_root).
"""

from __future__ import annotations

import json
import os

import structlog

from .conftest import ApiFactory, as_nobody


async def test_nobody_is_refused_reads_and_mutations(make_api: ApiFactory, temp_group: str) -> None:
    api = await make_api(read_group=temp_group)
    # The socket is 0660 root:group: let nobody reach it, so the API itself must refuse.
    os.chmod(api.socket, 0o666)
    before = api.queue.total
    with structlog.testing.capture_logs() as logs:
        for method, path in (
            ("GET", "/v1/status"),
            ("GET", "/v1/events"),
            ("POST", "/v1/reconcile"),
        ):
            code, body = await as_nobody(api.socket, method, path)
            assert code == 403, (method, path, body)
            error = json.loads(body)["error"]
            assert error["code"] == "forbidden" and "uid 65534" in error["message"]
    assert api.queue.total == before  # the refused mutation queued nothing
    denials = [e for e in logs if e["event"] == "api.denied"]
    assert len(denials) == 3
    assert all(e["uid"] == 65534 and e["pid"] > 1 for e in denials)


async def test_read_group_member_reads_but_may_not_mutate(
    make_api: ApiFactory, temp_group: str
) -> None:
    api = await make_api(read_group=temp_group)
    code, body = await as_nobody(api.socket, "GET", "/v1/status", groups=temp_group)
    assert code == 200 and json.loads(body)["api"] == 1
    code, body = await as_nobody(api.socket, "GET", "/v1/history", groups=temp_group)
    assert code == 200
    before = api.queue.total
    code, body = await as_nobody(api.socket, "POST", "/v1/reload", groups=temp_group)
    assert code == 403 and json.loads(body)["error"]["code"] == "forbidden"
    assert api.queue.total == before


async def test_write_group_member_may_mutate(make_api: ApiFactory, temp_group: str) -> None:
    api = await make_api(read_group=temp_group, write_group=temp_group)
    code, body = await as_nobody(api.socket, "POST", "/v1/reconcile", groups=temp_group)
    assert code == 200 and json.loads(body)["answered"] is True


async def test_root_only_socket_when_the_group_is_missing(make_api: ApiFactory) -> None:
    api = await make_api()  # read_group names no group
    assert os.stat(api.socket).st_mode & 0o777 == 0o600
    code, _ = await as_nobody(api.socket, "GET", "/v1/status")
    assert code == 0  # the file is root's alone: nobody cannot even connect
    code, status = await api.get("/v1/status")  # root still can
    assert code == 200
    assert any("root-only" in n for n in status["daemon"]["notes"])
