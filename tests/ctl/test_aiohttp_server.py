"""rdmad-ctl's own HTTP against aiohttp, the framework the daemon's API runs on: JSON
answers with their Content-Length, error answers, and a chunked event stream."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from rdmad import exits
from tests.ctl.conftest import ctl, fixture


def _app() -> web.Application:
    status = fixture("status-blocked.json")

    async def get_status(request: web.Request) -> web.Response:
        return web.json_response(status)

    async def post_reload(request: web.Request) -> web.Response:
        body = {"error": {"status": 403, "code": "forbidden", "message": "uid 65534 denied"}}
        return web.json_response(body, status=403)

    async def get_config(request: web.Request) -> web.Response:
        raise web.HTTPInternalServerError()  # aiohttp's own text answer

    async def events(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b": keepalive\n\n")
        for n in (1, 2):
            data = json.dumps({"summary": "s", "converged": n == 2, "counts": {}, "passes": n})
            await resp.write(f"event: status\ndata: {data}\n\n".encode())
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/v1/status", get_status)
    app.router.add_post("/v1/reload", post_reload)
    app.router.add_get("/v1/config", get_config)
    app.router.add_get("/v1/events", events)
    return app


@pytest.fixture
def aiohttp_socket(short_dir: Path) -> Iterator[str]:
    path = str(short_dir / "api.sock")
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app())

    async def start() -> None:
        await runner.setup()
        await web.UnixSite(runner, path).start()

    thread = threading.Thread(target=loop.run_forever)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    try:
        yield path
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def test_json_answer(aiohttp_socket: str) -> None:
    result = ctl("status", "--json", socket=aiohttp_socket)
    assert result.code == exits.FAIL  # the blocked node
    assert json.loads(result.out) == fixture("status-blocked.json")


def test_error_answers(aiohttp_socket: str) -> None:
    denied = ctl("reload", socket=aiohttp_socket)
    assert denied.code == exits.DENIED and "uid 65534 denied" in denied.err
    broken = ctl("config", socket=aiohttp_socket)
    assert broken.code == exits.FAIL
    assert "answered /v1/config with 500: 500: Internal Server Error" in broken.err


def test_chunked_event_stream(aiohttp_socket: str) -> None:
    result = ctl("watch", "--json", socket=aiohttp_socket)
    *events, end = [json.loads(line) for line in result.out.splitlines()]
    assert [e["data"]["passes"] for e in events] == [1, 2]
    assert result.code == exits.FAIL and "closed the event stream" in result.err
    assert end["error"]["exit"] == exits.FAIL
