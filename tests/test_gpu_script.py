"""experiments/validation/gpu_h200.py runs only where a GPU is lent, never in CI: its commands must
still parse with ppsim's own CLI, name models that exist and write to distinct places."""

import argparse

from experiments.validation.gpu_h200 import CUDNN, EXPANDABLE, steps_of
from ppsim.cli import build_parser
from ppsim.models.shape import load_model


def _out_of(argv: list[str]) -> str:
    flag = next(f for f in ("--output-dir", "--output") if f in argv)
    return argv[argv.index(flag) + 1]


def test_every_gpu_step_parses_and_writes_its_own_folder(tmp_path):
    args = argparse.Namespace(device="cuda", mid_model="llama-3-8b", mid_dtype="bfloat16")
    steps = steps_of(args, tmp_path)
    parser = build_parser()
    outs = []
    for name, cmd, limit, _env in steps:
        argv = cmd[cmd.index("ppsim.cli") + 1 :]
        ns = parser.parse_args(argv)
        assert ns.command in ("calibrate", "validate", "engine"), name
        assert (ns.device if ns.command == "calibrate" else ns.live_engine_device) == "cuda", name
        assert 0 < limit <= 120, name
        load_model(ns.model)  # a shipped preset
        outs.append(_out_of(argv))
        assert outs[-1].startswith(str(tmp_path)), name
    assert len(set(outs)) == len(outs)  # no step overwrites another's results
    by_name = {name: env for name, _cmd, _limit, env in steps}
    assert by_name["validate-mid-cudnn"] == CUDNN and by_name["validate-mid-expandable"] == EXPANDABLE
    assert by_name["validate-mid-pp1"] == {}  # the reference run has the defaults
    # every validation reads a profile that an earlier step writes
    written = []
    for name, cmd, _limit, _env in steps:
        argv = cmd[cmd.index("ppsim.cli") + 1 :]
        if "--profile" in argv:
            assert argv[argv.index("--profile") + 1] in written, name
        written.append(_out_of(argv))
