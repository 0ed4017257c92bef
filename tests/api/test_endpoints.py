"""Every endpoint of docs/API.md over the real socket, against a real agent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rdmad.model import ObjectState
from rdmad.status import HistoryEntry

from .conftest import Api, ApiFactory, until


async def test_status_document(api: Api) -> None:
    await until(lambda: api.host.links == {"rxe0": "eth0", "rxe1": "eth1"}, "links made")
    await until(lambda: api.agent.status.current.count(ObjectState.CONVERGED) == 2, "converged")
    code, doc = await api.get("/v1/status")
    assert code == 200
    assert doc["api"] == 1 and doc["converged"] is True
    assert doc["counts"]["converged"] == 2 and doc["counts"]["blocked"] == 0
    assert set(doc["counts"]) == {s.value for s in ObjectState}
    d = doc["daemon"]
    assert d["ready"] is True and d["config_ok"] is True and d["passes"] >= 1
    assert d["started_at"] is not None and d["config_errors"] == []
    assert any("rdmad.d/10-more.toml" in f for f in d["config_files"])
    assert f"group '{'rdmad-nonesuch'}' does not exist" in " ".join(d["notes"])
    objs = {o["obj"]: o for o in doc["objects"]}
    assert set(objs) == {"rxe rxe0", "rxe rxe1"}
    o = objs["rxe rxe0"]
    assert o["kind"] == "rxe" and o["state"] == "converged" and o["reason"] == ""
    for key in ("desired", "observed", "attributes", "vfs", "last_error", "errno", "last_change"):
        assert key in o


async def test_plan_is_the_daemons_own_next_pass_and_applies_nothing(api: Api) -> None:
    await until(lambda: "rxe1" in api.host.links, "rxe1 made")
    await until(lambda: api.agent.status.current.count(ObjectState.CONVERGED) == 2, "converged")
    del api.host.links["rxe1"]  # someone deleted it; no event tells the agent
    applied = len(api.host.applied)
    code, doc = await api.get("/v1/plan")
    assert code == 200, doc
    [action] = doc["actions"]
    assert action["obj"] == "rxe rxe1" and action["kind"] == "add-rxe"
    assert action["changes_kernel"] is True and "eth1" in action["describe"]
    assert {"obj": "rxe rxe1", "state": "pending"}.items() <= doc["objects"][1].items()
    assert len(api.host.applied) == applied and "rxe1" not in api.host.links


async def test_reconcile_runs_a_pass_and_waits_for_it(api: Api) -> None:
    await until(lambda: api.agent.status.current.count(ObjectState.CONVERGED) == 2, "converged")
    del api.host.links["rxe0"]
    code, doc = await api.post("/v1/reconcile")
    assert code == 200, doc
    assert doc["queued"] is True and doc["answered"] is True
    assert doc["pass"] >= 2 and "summary" in doc
    assert api.host.links["rxe0"] == "eth0"  # that pass re-created it


async def test_reconcile_without_waiting_is_accepted(api: Api) -> None:
    code, doc = await api.post("/v1/reconcile?wait=0")
    assert code == 202 and doc["queued"] is True and doc["answered"] is False
    number = doc["trigger"]
    await until(lambda: api.agent.status.current.answered >= number, "the pass answered")


async def test_reload_reads_the_config_again(api: Api) -> None:
    (api.config_dir / "rdmad.d" / "20-third.toml").write_text(
        '[[rxe]]\nname = "rxe2"\nnetdev = { name = "eth2" }\n'
    )
    code, doc = await api.post("/v1/reload", json={})
    assert code == 200 and doc["answered"] is True
    code, status = await api.get("/v1/status")
    assert "rxe rxe2" in {o["obj"] for o in status["objects"]}
    code, history = await api.get("/v1/history")
    assert "config-reloaded" in {e["event"] for e in history["entries"]}


async def test_bad_wait_is_400_and_queues_nothing(api: Api) -> None:
    before = api.queue.total
    for query in ("wait=soon", "wait=-1", "wait=1e9", "wait=nan", "nope=1"):
        code, doc = await api.post(f"/v1/reconcile?{query}")
        assert code == 400, query
        assert doc["error"]["code"] == "bad-request" and doc["error"]["status"] == 400
    assert api.queue.total == before


async def test_history_filters(api: Api) -> None:
    await until(lambda: api.agent.status.current.count(ObjectState.CONVERGED) == 2, "converged")
    store = api.agent.status
    store.record(
        [
            HistoryEntry(100.0, "applied", obj="rxe old", what="x: a -> b"),
            HistoryEntry(200.0, "failed", obj="rxe old", what="x: b -> c", errno=22),
        ]
    )
    code, doc = await api.get("/v1/history")
    assert code == 200 and len(doc["entries"]) >= 4
    assert {"at", "event", "obj", "what", "reason", "cause", "error", "errno"} <= set(
        doc["entries"][0]
    )
    code, doc = await api.get("/v1/history?obj=rxe%20old")
    assert [e["at"] for e in doc["entries"]] == [100.0, 200.0]
    code, doc = await api.get("/v1/history?obj=rxe%20old&since=150")
    assert [e["errno"] for e in doc["entries"]] == [22]
    code, doc = await api.get("/v1/history?limit=1")
    assert len(doc["entries"]) == 1 and doc["entries"][0]["at"] == 200.0  # the newest
    for bad in ("since=yesterday", "limit=0", "limit=x", "limit=100000", "obj=a&color=1"):
        code, doc = await api.get(f"/v1/history?{bad}")
        assert code == 400 and doc["error"]["code"] == "bad-request", bad


async def test_config_with_origins(api: Api) -> None:
    code, doc = await api.get("/v1/config")
    assert code == 200 and doc["ok"] is True and doc["errors"] == []
    main, dropin = (
        str(api.config_dir / "rdmad.toml"),
        str(api.config_dir / "rdmad.d/10-more.toml"),
    )
    assert doc["files"] == [main, dropin]
    assert doc["config"]["rxe"][1] == {"name": "rxe1", "netdev": {"name": "eth1"}}
    values = {v["key"]: v for v in doc["values"]}
    assert values["daemon.settle"] == {
        "key": "daemon.settle", "value": "10ms", "file": main, "file_key": "daemon.settle"
    }  # fmt: skip
    # The drop-in's first [[rxe]] is the merged config's second.
    assert values["rxe[1].netdev.name"]["file"] == dropin
    assert values["rxe[1].netdev.name"]["file_key"] == "rxe[0].netdev.name"


async def test_config_errors_are_shown_not_fatal(api: Api) -> None:
    (api.config_dir / "rdmad.d" / "30-bad.toml").write_text("[daemon]\nsettle = 'soon'\n")
    code, doc = await api.get("/v1/config")
    assert code == 200 and doc["ok"] is False
    assert any("30-bad.toml:2: daemon.settle" in e for e in doc["errors"])
    assert {"key": "daemon.settle", "value": "soon"}.items() <= {
        v["key"]: v for v in doc["values"]
    }["daemon.settle"].items()


async def test_snapshot_of_the_node(api: Api) -> None:
    code, doc = await api.get("/v1/snapshot")
    assert code == 200, doc
    assert doc["toml"].startswith("# Written by `rdmad snapshot` from this host")
    pcis = [s["pf"]["pci"] for s in doc["config"]["sriov"]]
    assert "0000:3b:00.0" in pcis
    assert doc["settings_unknown"]  # a sysfs tree: VF settings travel over netlink only


async def test_snapshot_failure_is_503_json(make_api: ApiFactory) -> None:
    def broken() -> object:
        raise OSError(5, "Input/output error")

    api = await make_api(observe=broken)
    code, doc = await api.get("/v1/snapshot")
    assert code == 503 and "cannot observe the node" in doc["error"]["message"]


async def test_metrics_served_on_the_socket(api: Api) -> None:
    for path in ("/metrics", "/v1/metrics"):
        async with api.session.get(api.url(path)) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=")
            text = await resp.text()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert [s.value for s in families["rdmad_up"].samples] == [1.0]
        assert families["rdmad_reconcile_passes"].samples[0].value >= 1


async def test_unknown_path_and_method_are_json(api: Api) -> None:
    code, doc = await api.get("/v1/nope")
    assert code == 404 and doc["error"] == {
        "status": 404, "code": "not-found", "message": doc["error"]["message"]
    }  # fmt: skip
    code, doc = await api.post("/v1/status")
    assert code == 405 and doc["error"]["code"] == "method-not-allowed"
    code, doc = await api.get("/v1/reload")
    assert code == 405
    code, doc = await api.get("/v1/plan?verbose=1")
    assert code == 400 and "takes no parameters" in doc["error"]["message"]
    code, doc = await api.get("/v1/status?verbose=1")
    assert code == 400 and "unknown parameter(s): verbose" in doc["error"]["message"]


@pytest.mark.parametrize("wait", ["-1", "601", "soon", "nan"])
async def test_status_wait_out_of_range_is_400(api: Api, wait: str) -> None:
    code, doc = await api.get(f"/v1/status?wait={wait}")
    assert code == 400 and doc["error"]["message"].startswith("wait: "), doc


async def test_status_wait_answers_at_once_when_converged(api: Api) -> None:
    await until(lambda: api.agent.status.current.converged, "converged")
    started = time.monotonic()
    code, doc = await api.get("/v1/status?wait=30")
    assert code == 200 and doc["converged"] is True
    assert time.monotonic() - started < 5  # not the 30 s


async def test_status_wait_is_answered_by_a_pass_that_looked_after_the_request(
    api: Api,
) -> None:
    """The verdict a wait gets is never older than the request: rxe0 was deleted and no
    event told the agent (as after a change rdmad hears of only at its drift check, or
    before it has read the news of one), so the last pass's converged is stale. The
    answer comes from a pass that began after the request: it finds rxe0 gone and makes
    it again. Without ?wait= the status is the last pass's, as before, and says nothing
    of answering."""
    await until(lambda: api.agent.status.current.converged, "converged")
    del api.host.links["rxe0"]
    code, doc = await api.get("/v1/status")
    assert code == 200 and doc["converged"] is True and "answered" not in doc
    before = api.queue.total
    code, doc = await api.get("/v1/status?wait=30")
    assert code == 200 and doc["converged"] is True, doc
    assert api.host.links.get("rxe0") == "eth0", "answered by the pass before the request"
    assert doc["answered"] is True
    assert api.agent.status.current.answered > before


async def test_status_wait_says_when_no_pass_answered_in_time(make_api: ApiFactory) -> None:
    """No pass answers (the agent stopped; a pass stuck on a slow write): the document
    is the last pass's, converged as it was, with answered false, so a waiter does not
    take an old verdict for the node's."""
    api = await make_api()
    await until(lambda: api.agent.status.current.converged, "converged")
    api.agent.stop()
    await until(lambda: api.agent.stopping, "stopped")
    code, doc = await api.get("/v1/status?wait=0.2")
    assert code == 200 and doc["converged"] is True and doc["answered"] is False, doc


async def test_status_wait_answers_when_a_pass_converges_the_node(api: Api) -> None:
    """Declared rxe2 on eth9, which the host lacks: pending. A request waiting up to 30 s
    is answered by the pass that creates it once eth9 appears, not by its deadline;
    one that waits 0.3 s is answered then, not converged."""
    (api.config_dir / "rdmad.d" / "20-third.toml").write_text(
        '[[rxe]]\nname = "rxe2"\nnetdev = { name = "eth9" }\n'
    )
    code, doc = await api.post("/v1/reload")
    assert code == 200 and doc["converged"] is False, doc
    started = time.monotonic()
    code, doc = await api.get("/v1/status?wait=0.3")
    assert code == 200 and doc["converged"] is False
    assert time.monotonic() - started >= 0.3
    waiting = asyncio.ensure_future(api.get("/v1/status?wait=30"))
    waiters = api.server.waiters
    assert waiters is not None
    await until(lambda: waiters.pending == 1, "the request waits")
    assert not waiting.done()
    api.host.netdevs.append("eth9")
    code, _ = await api.post("/v1/reconcile?wait=0")
    assert code == 202
    code, doc = await asyncio.wait_for(waiting, 10)
    assert code == 200 and doc["converged"] is True
    assert api.host.links["rxe2"] == "eth9"


async def test_malformed_json_body_is_400_and_queues_nothing(api: Api) -> None:
    before = api.queue.total
    code, doc = await api.post(
        "/v1/reconcile", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert code == 400 and doc["error"]["code"] == "bad-request"
    assert "not JSON" in doc["error"]["message"]
    assert api.queue.total == before


async def test_oversized_body_is_413_and_queues_nothing(api: Api) -> None:
    before = api.queue.total
    code, doc = await api.post("/v1/reload", data=b"{" + b" " * (65 * 1024) + b"}")
    assert code == 413 and doc["error"]["code"] == "too-large"
    # Without a Content-Length (chunked), the limit holds while reading.

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(80):
            yield b" " * 1024

    code, doc = await api.post("/v1/reload", data=chunks())
    assert code == 413 and doc["error"]["code"] == "too-large"
    assert api.queue.total == before


async def test_unavailable_when_the_agent_does_not_answer(make_api: ApiFactory) -> None:
    api = await make_api()
    api.agent.stop()  # nothing answers triggers any more
    await until(lambda: api.agent.stopping, "stopped")
    code, doc = await api.post("/v1/reconcile?wait=0.2")
    assert code == 202 and doc["answered"] is False


async def test_close_answers_waiting_requests_with_503(make_api: ApiFactory) -> None:
    api = await make_api()
    api.agent.stop()
    request = asyncio.ensure_future(api.post("/v1/reconcile?wait=30"))
    waiters = api.server.waiters
    assert waiters is not None
    await until(lambda: waiters.pending == 1, "the request waits")
    await api.server.close()
    code, doc = await asyncio.wait_for(request, 5)
    assert code == 503 and doc["error"]["code"] == "unavailable"
    assert not Path(api.socket).exists()
