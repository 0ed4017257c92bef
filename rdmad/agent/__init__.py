"""The agent: one task that observes, plans and applies, driven by coalesced triggers.

``loop`` schedules, ``runner`` runs one pass (its docstring tells the whole order of
one), ``fastpath`` holds its shortcuts on the event path, ``applying`` applies one plan,
``reporting`` tells the world, ``memory`` keeps config and state, ``timers`` keep
time, ``protocols`` say what the agent needs from outside. It imports nothing
from ``rdmad.kernel``: tests drive it with a fake host and a fake clock.
"""

from rdmad.agent.loop import Agent
from rdmad.agent.options import AgentOptions, PassInfo
from rdmad.agent.protocols import (
    ConfigLoader,
    Host,
    Notifier,
    NullNotifier,
    Planner,
    ResultLike,
    WriteLike,
)

__all__ = [
    "Agent",
    "AgentOptions",
    "ConfigLoader",
    "Host",
    "Notifier",
    "NullNotifier",
    "PassInfo",
    "Planner",
    "ResultLike",
    "WriteLike",
]
