"""How the rdma_cm check (traffic.py) judges an rping client's run, on the host: a run
that lost rping's own teardown race after every round crossed is a success, and
nothing else that exits non-zero is."""

from __future__ import annotations

import pytest
from traffic import RPING_ROUNDS, TEARDOWN_RACE, rping_verdict

ROUNDS = "".join(f"ping data: rdma-ping-{n}: ABCDEF\n" for n in range(RPING_ROUNDS))


def test_a_clean_run_succeeds() -> None:
    assert rping_verdict(0, ROUNDS, "") is None
    assert rping_verdict(0, ROUNDS, "client DISCONNECT EVENT...\n") is None


def test_the_teardown_race_after_every_round_is_named_not_failed() -> None:
    # As the lab saw it: five verified rounds, then the CM thread's read of a destroyed
    # event channel, and exit status 255.
    assert rping_verdict(255, ROUNDS, f"{TEARDOWN_RACE}\n") == TEARDOWN_RACE
    assert (
        rping_verdict(255, ROUNDS, f"client DISCONNECT EVENT...\n{TEARDOWN_RACE}\n")
        == TEARDOWN_RACE
    )


@pytest.mark.parametrize(
    ("rc", "out", "err", "said"),
    [
        # A round short: the race's message does not excuse missing data.
        (255, ROUNDS.split("\n", 1)[1], f"{TEARDOWN_RACE}\n", "4 of 5 rounds"),
        # Data that came back different stops rping before its line.
        (255, ROUNDS.split("\n", 1)[1], "data mismatch!\n", "4 of 5 rounds"),
        # Anything else on stderr, before or instead of the race's message.
        (255, ROUNDS, f"cq completion failed status 12\n{TEARDOWN_RACE}\n", "exit status 255"),
        (255, ROUNDS, f"{TEARDOWN_RACE}\nrping client failed: -1\n", "exit status 255"),
        (255, ROUNDS, "", "exit status 255"),
        # The same message with another exit status (timeout's 124, a signal).
        (124, ROUNDS, f"{TEARDOWN_RACE}\n", "exit status 124"),
        (0, "", "", "0 of 5 rounds"),
        (1, "", "cma event RDMA_CM_EVENT_REJECTED, error 28\n", "0 of 5 rounds"),
    ],
)
def test_every_other_run_fails_and_says_why(rc: int, out: str, err: str, said: str) -> None:
    verdict = rping_verdict(rc, out, err)
    assert verdict is not None and verdict != TEARDOWN_RACE
    assert verdict.startswith(said), verdict
