"""`rdmad plan` and the daemon decide which rxe links are rdmad's by the same rule.

The plan reads the state file without changing it (state.describe_ownership); the
agent loads it at start (Memory.load_state). For every kind of state file and boot,
both must arrive at the same set, or the printed plan is not what the daemon does.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rdmad.agent.memory import Memory
from rdmad.state import FILENAME, StateStore, describe_ownership, owned_rxe, read_state
from tests.support.fakeclock import FakeClock

CASES = {
    "same boot": ({"version": 1, "boot_id": "b2", "managed_rxe": ["rxe1", "rxe9"]}, "b2"),
    "earlier boot": ({"version": 1, "boot_id": "b1", "managed_rxe": ["rxe9"]}, "b2"),
    "file without boot id": ({"version": 1, "managed_rxe": ["rxe9"]}, "b2"),
    "this boot unknown": ({"version": 1, "boot_id": "b2", "managed_rxe": ["rxe9"]}, ""),
    "no file": (None, "b2"),
    "corrupt": ("{nope", "b2"),
    "wrong version": ({"version": 9, "boot_id": "b2", "managed_rxe": ["rxe9"]}, "b2"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_and_agent_own_the_same_links(case: str, tmp_path: Path) -> None:
    content, boot_id = CASES[case]
    path = tmp_path / FILENAME
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    planned, line = describe_ownership(path, boot_id)
    assert planned == owned_rxe(read_state(path)[0], boot_id)
    assert line.startswith("state: ")

    shared: Any = SimpleNamespace(clock=FakeClock())
    memory = Memory(
        shared,
        load_config=lambda: None,  # type: ignore[arg-type,return-value]
        state_store=StateStore(tmp_path),
        boot_id=boot_id,
        record=lambda *entries: None,
    )
    memory.load_state()
    assert memory.state.managed_rxe == set(planned)
    assert bool(planned) == (case == "same boot")
