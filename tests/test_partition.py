import pytest

from ppsim.errors import PPSimError
from ppsim.models.partition import layer_ranges, partition_layers


@pytest.mark.parametrize(
    "layers,pp,expect",
    [
        (32, 4, [8, 8, 8, 8]),
        (80, 6, [13, 13, 13, 14, 14, 13]),  # remainder from the second-to-last stage backwards
        (10, 4, [2, 3, 3, 2]),
        (7, 2, [4, 3]),
        (61, 8, [7, 7, 8, 8, 8, 8, 8, 7]),
    ],
)
def test_vllm_rule(layers, pp, expect):
    got = partition_layers("vllm", layers, pp)
    assert sum(got) == layers
    assert got == expect
    assert got[-1] == layers // pp  # never to the last stage


def test_last_heavy_rule():
    assert partition_layers("last-heavy", 61, 4) == [15, 15, 15, 16]
    assert partition_layers("last-heavy", 80, 6) == [13, 13, 13, 13, 14, 14]


def test_explicit_and_ranges():
    assert partition_layers([20, 20, 20, 20], 80, 4) == [20, 20, 20, 20]
    assert layer_ranges([2, 3, 1]) == [(0, 2), (2, 5), (5, 6)]


@pytest.mark.parametrize(
    "rule,layers,pp,fragment",
    [
        ([20, 20, 20], 80, 4, "3 entries"),
        ([20, 20, 20, 19], 80, 4, "sums to 79"),
        ([0, 40, 20, 20], 80, 4, "at least one"),
        ("even", 80, 4, "unknown rule"),
        ("vllm", 4, 8, "at most 4"),
    ],
)
def test_partition_errors(rule, layers, pp, fragment):
    with pytest.raises(PPSimError, match=fragment):
        partition_layers(rule, layers, pp)
