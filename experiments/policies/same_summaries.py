"""Same summaries from two source trees: a refactor of the policies must not change any answer.

Runs every policy (and its knobs' variants) on small chat and long-prompt scenarios, in the flat
scenario form both trees accept, once with this tree and once with ``OTHER`` (a checkout of the
tree before the change, e.g. ``git archive <commit> | tar -x -C /tmp/before``), each in its own
process, and compares the summaries field by field (exact equality)::

    python experiments/policies/same_summaries.py /tmp/before
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# name -> (pp, engine fields in the flat form)
CASES = {
    "vllm-sync": (4, {"policy": "vllm-sync"}),
    "vllm-batch-queue": (4, {"policy": "vllm-batch-queue"}),
    "vllm-batch-queue+throttle": (4, {"policy": "vllm-batch-queue", "pp_throttle": True}),
    "vllm-async-pp1": (1, {"policy": "vllm-async"}),
    "vllm-mrv2": (4, {"policy": "vllm-mrv2"}),
    "vllm-mrv2+cap+serialized": (4, {"policy": "vllm-mrv2", "mrv2_decode_cap": True, "pp_broadcast": "serialized"}),
    "sglang-ring": (4, {"policy": "sglang-ring"}),
    "sglang-ring+depth1": (4, {"policy": "sglang-ring", "pp_async_batch_depth": 1}),
    "sglang-ring+depth2+dynamic": (
        2,
        {
            "policy": "sglang-ring",
            "pp_async_batch_depth": 2,
            "enable_dynamic_chunking": True,
            "chunked_prefill_size": 1024,
        },
    ),
    "trtllm-slots": (4, {"policy": "trtllm-slots", "enable_chunked_prefill": True}),
    "trtllm-slots+async+mbs": (
        4,
        {"policy": "trtllm-slots", "trtllm_relay": "async", "max_batch_size": 8, "enable_chunked_prefill": True},
    ),
    "llamacpp": (2, {"policy": "llamacpp", "llamacpp_ubatch_tokens": 256}),
    "no-pp": (4, {"policy": "no-pp", "dp_routing": "least-loaded"}),
}
WORKLOADS = {
    "chat": {
        "num_prompts": 60,
        "random_input_len": 512,
        "random_output_len": 64,
        "random_range_ratio": 0.5,
        "request_rate": 40.0,
    },
    "long": {"num_prompts": 6, "random_input_len": 6000, "random_output_len": 16, "request_rate": "inf"},
}


def summaries() -> dict[str, dict]:
    from ppsim.config import build_scenario
    from ppsim.run import run_scenario

    out = {}
    for name, (pp, engine) in CASES.items():
        for wl, w in WORKLOADS.items():
            s = build_scenario(
                None,
                {
                    "model": "llama-3-8b",
                    "hardware": "h100-sxm",
                    "seed": 1,
                    "cluster": {"pipeline_parallel_size": pp},
                    "engine": {"max_num_seqs": 32, **engine},
                    "workload": w,
                },
            )
            out[f"{name}/{wl}"] = run_scenario(s).summary
    return out


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--dump":  # in the other tree (PYTHONPATH)
        import ppsim

        print(f"other tree: {Path(ppsim.__file__).parent}", flush=True)
        Path(sys.argv[2]).write_text(json.dumps(summaries(), default=str))
        return 0
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    other = Path(sys.argv[1]).resolve()
    dump = Path(os.environ.get("TMPDIR", "/tmp")) / f"same_summaries_{os.getpid()}.json"
    env = {**os.environ, "PYTHONPATH": str(other)}
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--dump", str(dump)],
        env=env,
        cwd=other,
        check=True,
        timeout=1800,
    )
    theirs = json.loads(dump.read_text())
    dump.unlink()
    ours = json.loads(json.dumps(summaries(), default=str))
    bad = [(k, f, theirs[k].get(f), v) for k in ours for f, v in ours[k].items() if theirs[k].get(f) != v]
    missing = sorted(set(theirs) ^ set(ours))
    for k, f, a, b in bad[:20]:
        print(f"DIFFERENT {k} {f}: before {a}, now {b}")
    print(
        f"{len(ours)} scenarios, {sum(len(v) for v in ours.values())} summary fields compared: "
        f"{len(bad)} differ, {len(missing)} scenarios missing"
    )
    return 1 if bad or missing else 0


if __name__ == "__main__":
    if "--dump" not in sys.argv:
        sys.path.insert(0, str(HERE.parents[1]))
    else:
        sys.path.remove(str(HERE))  # the script's folder, not this tree's packages
    raise SystemExit(main())
