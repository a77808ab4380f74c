"""What an engine-core loop asks its executor to do. Loops are generators yielding these.

The SimPy executor turns ``Cpu`` into a timeout and ``Await`` into waiting on the micro-batch's
completion event; the live engine ignores ``Cpu`` (real CPU time passes by itself) and turns
``Await`` into a blocking receive of the sampled tokens.

``Cpu``, ``Launch``, ``Await``, ``Poll`` and ``Emit`` are made once or more per engine-core step: they are
named tuples (immutable; a hot loop builds them with ``tuple.__new__``, without a Python-level
constructor). Dispatch on them by ``type``: tuples of equal fields compare equal across types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ppsim.policy.plan import StepPlan
from ppsim.policy.requests import TokenOutput


class Cpu(NamedTuple):
    """Engine-core CPU work: ``kind`` in {schedule, update}, over ``n`` requests.

    ``relay`` token ids are relayed to the first stage in the same stretch of CPU time (the
    scheduler-relay return path, :mod:`ppsim.policy.returnpath`).
    """

    kind: str
    n: int
    relay: int = 0


class Launch(NamedTuple):
    """Start ``plan`` on the pipeline without waiting (an empty plan completes at once)."""

    plan: StepPlan


class Await(NamedTuple):
    """Block until ``plan``'s sampled tokens are back at the engine core."""

    plan: StepPlan


class Poll(NamedTuple):
    """Non-blocking: is ``plan``'s output already back? The executor replies True or False."""

    plan: StepPlan


class Emit(NamedTuple):
    """Tokens that reached the engine core; the executor timestamps and streams them."""

    outputs: tuple[TokenOutput, ...]


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing to schedule and nothing in flight: wait for the next arrival."""


Action = Cpu | Launch | Await | Poll | Emit | Idle
