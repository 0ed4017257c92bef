"""POST/DELETE /v1/pause: a bounded pause written where the guard writes it; bad bodies refused.

That the daemon then holds back module loads and rxe links, and shows the pause in
status, is tests/lab/test_guard_lab.py (a real daemon on a real kernel).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rdmad.kernel.pause import PAUSE_FILE, read_pause, read_pause_record
from rdmad.kernel.sysfs import Sysfs
from tests.api.conftest import ApiFactory


async def test_pause_writes_the_file_and_resume_ends_it_saying_who(
    make_api: ApiFactory, tmp_path: Path
) -> None:
    root = tmp_path / "pause-root"
    api = await make_api(pause_root=str(root))
    code, doc = await api.post("/v1/pause?wait=5", json={"seconds": 90, "reason": "MOFED upgrade"})
    assert code == 200 and doc["answered"] is True, doc
    raw = json.loads((root / PAUSE_FILE).read_text())
    assert raw["reason"] == "MOFED upgrade" and raw["until"] - raw["since"] == 90
    assert raw["by"].startswith("rdmad-ctl pause (uid 0, pid ")
    assert list(raw["modules"]) == ["ib_core"]  # ends early once the RDMA core is back
    assert read_pause(Sysfs(root), time.time()) is not None
    async with api.session.delete(api.url("/v1/pause?wait=5")) as resp:
        assert resp.status == 200
    assert read_pause(Sysfs(root), time.time()) is None
    record = read_pause_record(Sysfs(root), time.time())
    assert record is not None and record.ended_why is not None
    assert record.ended_why.startswith("ended by rdmad-ctl resume (uid 0, pid ")


async def test_bad_pause_requests_are_400_and_write_nothing(
    make_api: ApiFactory, tmp_path: Path
) -> None:
    root = tmp_path / "pause-root"
    api = await make_api(pause_root=str(root))
    before = api.queue.total
    for body in (
        {},
        {"seconds": "60"},
        {"seconds": True},
        {"seconds": 0},
        {"seconds": 3601},
        {"seconds": 60, "reason": ""},
        {"seconds": 60, "reason": "x" * 201},
        [60],
    ):
        code, doc = await api.post("/v1/pause", json=body)
        assert code == 400, body
        assert doc["error"]["status"] == 400
    code, _ = await api.post("/v1/pause", data=b"{nope")
    assert code == 400
    assert not (root / PAUSE_FILE).exists()
    assert api.queue.total == before
