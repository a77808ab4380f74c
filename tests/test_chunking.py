"""SGLang's dynamic chunking (ppsim.policy.chunking): hand-computed plans, fits, properties, errors."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ppsim.errors import PPSimError
from ppsim.policy.chunking import (
    ChunkModel,
    chunk_plan,
    fit_quadratic,
    fit_refined,
    predict_next_chunk_size,
    profile_lengths,
)

UNIT = ChunkModel(1.0, 0.0, 0.0)  # f(l) = l^2: x(L) = sqrt(L^2 + C^2) - L
# a prompt of 20000 tokens is past tiny's context (max_position_embeddings 4096): chunk-plan plans it when
# --max-model-len raises the context, as SGLang does with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
LONG_CONTEXT = ("--max-model-len", "20000")


def test_plan_matches_hand_computation():
    # C = 4096, sigma = 1, alignment 64:
    # L=4096: x = 4096 (sqrt 2 - 1) = 1696.6 -> 1664;  L=5760: sqrt(5760^2 + 4096^2) - 5760 = 1307.9 -> 1280
    # L=7040: 8144.9 - 7040 = 1104.9 -> 1088;  L=8128: 9101.7 - 8128 = 973.7 < C // 4 -> 1024
    # 8128 + 24 x 1024 = 32704, so the last chunk is 32768 - 32704 = 64.
    sizes = chunk_plan(32768, 4096, UNIT, smooth_factor=1.0)
    assert sizes[:5] == [4096, 1664, 1280, 1088, 1024]
    assert sizes[4:-1] == [1024] * 24 and sizes[-1] == 64


def test_smoothing_and_page_alignment():
    # sigma = 0.75: 4096 + 0.75 (1696.6 - 4096) = 2296.4 -> 2240 (multiple of 64), 2048 with page 256
    assert predict_next_chunk_size(UNIT, 4096, 4096, 0.75) == 2240
    assert predict_next_chunk_size(UNIT, 4096, 4096, 0.75, page_size=256) == 2048
    # sigma = 0 keeps the initial chunk: the fixed-chunk plan
    assert chunk_plan(10000, 2048, UNIT, smooth_factor=0.0) == [2048] * 4 + [1808]
    assert chunk_plan(10000, 2048, None) == chunk_plan(10000, 2048, UNIT, smooth_factor=0.0)
    # the context cap (SGLang leaves 100 tokens): 4096 - 2000 - 100 = 1996 -> 1984
    assert predict_next_chunk_size(UNIT, 2000, 4096, 0.0, context_len=4096) == 1984


def test_fit_recovers_sglang_profile():
    a, b, c = 2e-7, 0.03, 1.5
    lengths = profile_lengths(8192)
    assert len(lengths) == 128 and lengths[0] == 10240 and lengths[1] == 10240 - 80
    m = fit_quadratic(lengths, [a * n * n + b * n + c for n in lengths])
    assert m.a == pytest.approx(a, rel=1e-6) and m.b == pytest.approx(b, rel=1e-6) and m.c == pytest.approx(c, rel=1e-6)
    assert m.target(8192) == pytest.approx(a * 8192**2 + b * 8192)


def test_refined_fit_and_its_effect():
    a, b, c, g = 1e-7, 0.02, 0.5, 2e-3
    pts = [(p, x) for p in (0, 4000, 8000, 16000) for x in (512, 1024, 2048, 4096)]
    m = fit_refined(
        [p for p, _ in pts], [x for _, x in pts], [c + g * p + b * x + a * (2 * p * x + x * x) for p, x in pts]
    )
    assert (m.a, m.b, m.gamma) == pytest.approx((a, b, g), rel=1e-6)
    # per-chunk prefix work makes later chunks smaller than the basic form predicts
    basic = ChunkModel(a, b, c)
    assert predict_next_chunk_size(m, 16000, 4096, 1.0) < predict_next_chunk_size(basic, 16000, 4096, 1.0)


@pytest.mark.parametrize(
    "times",
    [
        [1.0] * 5,  # too few samples
        [math.sqrt(n) for n in range(0, 2000, 100)],  # concave: a < 0
    ],
)
def test_bad_fits_error(times):
    lengths = list(range(0, 100 * len(times), 100))
    with pytest.raises(PPSimError, match="chunking"):
        fit_quadratic(lengths, times)


def test_a_linear_cost_fits_as_the_a_to_0_limit_and_keeps_chunks_at_c():
    """A linear cost is the a -> 0 limit of SGLang's predictor: x = T / b = C at every prefix."""
    lengths = list(range(100, 2100, 100))
    m = fit_quadratic(lengths, [0.5 * n for n in lengths], skip_first=False)
    assert m.a == 0.0
    assert set(chunk_plan(20000, 1024, m, smooth_factor=1.0)[:-1]) == {1024}


def test_bad_coefficients_error():
    with pytest.raises(PPSimError, match="a=-1"):
        ChunkModel(-1.0, 1.0, 0.0)
    with pytest.raises(PPSimError, match="b="):
        ChunkModel(1.0, -1.0, 0.0)


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.integers(1, 200_000),
    chunk=st.integers(64, 16384),
    smooth=st.floats(0.0, 1.0),
    page=st.sampled_from([1, 16, 64, 128]),
    a=st.floats(1e-9, 1e-5),
    b=st.floats(0.0, 0.1),
)
def test_plan_properties(prompt, chunk, smooth, page, a, b):
    sizes = chunk_plan(prompt, chunk, ChunkModel(a, b, 1.0), smooth, page)
    align = max(page, 64)
    floor = max(align, chunk // 4 // align * align)
    assert sum(sizes) == prompt
    assert all(n > 0 for n in sizes)
    assert sizes[0] == min(chunk, prompt) or (page > 1 and sizes[0] % page == 0) or sizes == [prompt]
    for n in sizes[1:-1]:
        assert n % align == 0 and n >= min(floor, chunk)
        assert n <= max(chunk, align)
    # chunks shrink (the quadratic model makes later tokens dearer), never grow
    assert all(x >= y for x, y in zip(sizes[1:-1], sizes[2:-1], strict=False))
    assert math.isfinite(sum(sizes))


def test_a_budget_under_one_page_takes_a_page_but_never_more_than_the_prompt():
    """Found by the property above: 65 tokens, a 64-token budget, 128-token pages planned one 128-token
    chunk. A chunk is rounded up to one page, and clamped to what is left of the prompt."""
    assert chunk_plan(65, 64, ChunkModel(7.9e-6, 0.0, 1.0), 0.0, 128) == [65]
    assert chunk_plan(300, 64, None, 0.0, 128) == [128, 128, 44]


def test_chunk_plan_cli(ppsim_cli):
    r = ppsim_cli(
        "chunk-plan",
        "--prompt-len",
        "32768",
        "--chunked-prefill-size",
        "4096",
        "--max-model-len",  # past llama-3-70b's 8192 (max_position_embeddings): given, as SGLang's env var allows
        "32768",
        "--coefficients",
        "1,0,0",
        "--smooth-factor",
        "1",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[:5] == [4096, 1664, 1280, 1088, 1024]
    r = ppsim_cli("chunk-plan", "--prompt-len", "1000", "--coefficients=-1,1,0")
    assert r.returncode == 2 and "must be >= 0" in r.stderr and "\n" == r.stderr[-1]
    r = ppsim_cli(
        "chunk-plan", "--prompt-len", "20000", "--model", "tiny", "--chunked-prefill-size", "2048", *LONG_CONTEXT
    )
    assert r.returncode == 0, r.stderr
    assert "chunks" in r.stdout and "a=" in r.stdout


def test_chunk_plan_refuses_a_prompt_past_the_models_context(capsys):
    """Without --max-model-len the context is the model's max_position_embeddings (tiny: 4096): a longer
    prompt is refused, naming --prompt-len, the context and --max-model-len; the prompt at the context plans."""
    code, _, err = _chunk_plan(capsys, "--prompt-len", "4097", "--coefficients", "1e-6,0.02,1.5")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: --prompt-len: 4097 tokens exceed the context of tiny, 4096 tokens") and (
        "--max-model-len 4097" in err
    ), err
    code, _, err = _chunk_plan(capsys, "--prompt-len", "4096", "--coefficients", "1e-6,0.02,1.5")
    assert code == 0, err
    code, _, err = _chunk_plan(capsys, "--prompt-len", "4097", "--coefficients", "1e-6,0.02,1.5", *LONG_CONTEXT)
    assert code == 0, err


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["fit-chunks", "--smooth-factor", "0.5"], "--smooth-factor: fit-chunks searches the smoothing factor"),
        (["fit-chunks", "--chunked-prefill-size", "2048"], "--chunked-prefill-size: fit-chunks searches"),
        (["fit-chunks", "--policy", "vllm-sync"], "--policy: fit-chunks always runs sglang-ring"),
        (["fit-chunks", "--no-enable-dynamic-chunking"], "--no-enable-dynamic-chunking: fit-chunks runs"),
        (["chunk-plan", "--prompt-len", "100", "--enable-dynamic-chunking"], "--enable-dynamic-chunking: chunk-plan"),
        (
            ["chunk-plan", "--prompt-len", "100", "--random-input-len", "100"],
            "--random-input-len: chunk-plan plans one",
        ),
    ],
)
def test_chunk_commands_reject_flags_they_would_override(argv, msg, capsys):
    from ppsim.cli import main

    assert main([*argv, "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1


def _chunk_plan(capsys, *argv: str) -> tuple[int, str, str]:
    from ppsim.cli import main

    code = main(["chunk-plan", "--model", "tiny", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "argv, first_line",
    [
        (["--coefficients", "0,1,0"], "model (quadratic, ms): a=0 b=1 c=0"),  # a linear cost: a = 0 is allowed
        (["--coefficients", "1e-6,0.02,1.5,1e-5"], "model (refined, ms): a=1e-06 b=0.02 c=1.5 gamma=1e-05"),
        (["--coefficients", "1e-6,0.02,1.5", "--page-size", "2048"], "model (quadratic"),
        (["--refined"], "model (refined, ms)"),
        (["--dynamic-chunking-form", "refined"], "model (refined, ms)"),
    ],
)
def test_chunk_plan_neighbours_of_the_refused_inputs_still_plan(argv, first_line, capsys):
    """a = 0 (a linear cost), the refined form given as a,b,c,gamma or fitted, a page as large as the chunk,
    a prompt as long as --max-model-len (past tiny's 4096): all still plan, and the form printed is the one used."""
    code, out, err = _chunk_plan(
        capsys, "--prompt-len", "20000", "--chunked-prefill-size", "2048", *LONG_CONTEXT, *argv
    )
    assert code == 0, err
    assert out.splitlines()[0].startswith(first_line), out


def test_a_linear_cost_given_as_coefficients_keeps_chunks_at_c(capsys):
    code, out, err = _chunk_plan(
        capsys,
        "--prompt-len",
        "20000",
        "--chunked-prefill-size",
        "2048",
        *LONG_CONTEXT,
        "--json",
        "--coefficients",
        "0,1,0",
    )
    assert code == 0, err
    assert set(json.loads(out)[:-1]) == {2048}


@pytest.mark.parametrize(
    "argv",
    [("--coefficients", "-1,0,0", "--prompt-len", "100"), ("--prompt-len", "5000")],
    ids=["coefficients", "context"],
)
def test_the_chunk_plan_examples_of_the_docs_are_the_real_messages(argv, capsys):
    """docs/reliability.md quotes chunk-plan's refusals of --coefficients -1,0,0 and of a prompt past tiny's
    context verbatim."""
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "reliability.md").read_text().splitlines()
    cmd = " ".join(("$ ppsim chunk-plan --model tiny", *argv))
    quoted = docs[docs.index(cmd) + 1]
    code, _, err = _chunk_plan(capsys, *argv)
    assert code == 2 and err == quoted + "\n"


@pytest.mark.parametrize("coeffs", [(0.0, 0.02, 1.5), (1e-6, 0.0, -3.0), (1e-6, 0.02, 1.5, 1e-5), (1e100, 1e100, 0.0)])
def test_meaningful_coefficients_in_a_file_are_accepted(coeffs):
    from ppsim.config import build_scenario

    pol = {"kind": "sglang-ring", "enable_dynamic_chunking": True, "dynamic_chunking_coefficients": list(coeffs)}
    s = build_scenario(None, {"model": "tiny", "engine": {"policy": pol}})
    assert s.engine.policy.dynamic_chunking_coefficients == coeffs
