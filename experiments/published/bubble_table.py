"""The GPipe bubble (P-1)/(M+P-1) for P in {2,4,8} x M in {4,8,16,32,64}, beside ppsim's simulation.

Published: Huang et al., GPipe (2018); quoted in the PP reference as 42.9% (S=4, M=4), 15.8%
(M=16), 4.5% (M=64). ppsim: M equal micro-batches launched at t = 0 through the simulator's own
stage processes (``ppsim.bubble.simulate_microbatches``), bubble = 1 - busy / (P x window).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import parse_args, pyplot, save_figure, write_result  # noqa: E402

from ppsim.bubble import MB_VALUES, PP_VALUES, bubble_rows  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv, __doc__)
    rows = []
    for r in bubble_rows():
        rows.append(
            {
                "P": r["pp"],
                "M": r["microbatches"],
                "published_bubble": r["analytic"],
                "ppsim_bubble": r["simulated"],
                "abs_diff": abs(r["analytic"] - r["simulated"]),
            }
        )
    notes = (
        "Published: (P-1)/(M+P-1) (GPipe). ppsim: equal stages, constant stage time, free links, M "
        "micro-batches launched at t=0 through `ppsim.sim.pipeline.PipelineSim`. "
        f"Largest difference: {max(r['abs_diff'] for r in rows):.2e}."
    )
    write_result(
        args.out,
        "bubble_table",
        "Pipeline bubble: (P-1)/(M+P-1) vs ppsim",
        rows,
        ["P", "M", "published_bubble", "ppsim_bubble", "abs_diff"],
        notes,
    )
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for p in PP_VALUES:
        sub = [r for r in rows if r["P"] == p]
        ax.plot(MB_VALUES, [r["published_bubble"] for r in sub], "-", label=f"P={p} published")
        ax.plot(MB_VALUES, [r["ppsim_bubble"] for r in sub], "o", label=f"P={p} ppsim")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batches M")
    ax.set_ylabel("bubble fraction")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, Path(args.out) / "bubble_table.png")
    plt.close(fig)
    return rows


if __name__ == "__main__":
    main()
