"""``validate``'s checks before any work: its own options, what the engine would refuse before spawning its
stages, and a workload of which it could serve no request; refused before a calibration of minutes or the
first engine run.

Without ``--profile`` the scenario is checked on the analytic cost model, a stand-in until the profile
is calibrated: the engine's checks read the model, the memory, the workload and the engine options, not
the cost of a step. Light to import (the command line reads :data:`MAX_REPEATS` for its help).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ppsim.errors import PPSimError

if TYPE_CHECKING:
    from ppsim.config import Scenario
    from ppsim.deployment import Prepared

MAX_REPEATS = 100  # engine runs, each with a start-up of seconds (tiny) to minutes; the spread needs a few


def check_repeats(repeats: int) -> None:
    if not 1 <= repeats <= MAX_REPEATS:
        raise PPSimError(f"--repeats: {repeats} must be in [1, {MAX_REPEATS}] (engine runs; 3 show the spread)")


def check_engine_inputs(s: Scenario) -> None:
    """The checks ``engine.run.run_engine`` makes before it spawns the stages, in its order (a bad
    checkpoint, a KV cache above ``--max-kv-gib``, a replay longer than an hour, ...), then
    :func:`check_servable` on the engine's KV pool."""
    from engine.run import check_replay_time, engine_num_blocks, fault_plan, stage_configs
    from ppsim.deployment import prepare

    prep0 = prepare(s)
    check_replay_time(prep0)
    prep = dataclasses.replace(prep0, num_blocks=engine_num_blocks(prep0, s.live_engine))
    fault_plan(s.live_engine, stage_configs(prep, s.live_engine))
    check_servable(prep)


def check_servable(prep: Prepared) -> None:
    """Refuse a workload whose every request the scheduler would reject (longer than ``max_model_len``,
    or more KV blocks than the whole cache): no request would be served, so none compared."""
    from ppsim.rejections import rejection_message

    w, bs = prep.requests, prep.scenario.engine.block_size
    total = w.prompt_len + w.output_len
    served = (total <= prep.max_model_len) & (-(-total // bs) <= prep.num_blocks)
    if not len(w) or served.any():
        return
    msg = rejection_message(w, set(w.req_id.tolist()), prep.max_model_len, prep.num_blocks, bs)
    raise PPSimError(f"workload: {msg}; validate compares served requests, and there would be none")
