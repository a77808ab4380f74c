"""The engine control-path profiler times the live engine's own queues and messages."""

from calibration.control import profile_control


def test_control_path_rows_and_magnitudes():
    rows = profile_control((1, 32), repeats=5)
    ops = {(r["op"], r["n"]) for r in rows}
    assert ops == {("launch", 1), ("launch", 32), ("return", 1), ("return", 32)}
    for r in rows:
        assert 0 < r["p10_s"] <= r["median_s"] <= r["p90_s"] < 0.5  # one-way, local: well under 0.5 s
