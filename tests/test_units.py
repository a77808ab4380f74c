"""Byte units and the host's available memory (ppsim/units.py, ppsim/hostmem.py): the one formatter and
the one /proc/meminfo reader the engine's preflight and calibration's memory check both use."""

from __future__ import annotations

import pytest

import calibration.host_memory as hm
import ppsim.hostmem as hostmem
from ppsim.units import GIB, MIB, format_bytes, format_gib


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (1023, "1023 B"), (32 * 1024, "32.0 KiB"), (1.5 * 1024**3, "1.50 GiB"), (3 * 1024**4, "3.00 TiB")],
)
def test_sizes_are_printed_in_their_unit(n, text):
    assert format_bytes(n) == text


def test_fixed_gib_sizes_keep_their_decimals():
    assert format_gib(0.3 * GIB) == "0.3 GiB"
    assert format_gib(131.44 * GIB) == "131.4 GiB"
    assert format_gib(0.125 * GIB, 2) == "0.12 GiB"


def _meminfo(monkeypatch, tmp_path, text: str) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(text)
    monkeypatch.setattr(hostmem, "MEMINFO", meminfo)


def test_host_memory_reads_mem_available(monkeypatch, tmp_path):
    _meminfo(monkeypatch, tmp_path, "MemTotal:       99999999 kB\nMemFree:           1 kB\nMemAvailable:   2048 kB\n")
    assert hostmem.host_available_bytes() == 2 * MIB
    assert hm.available_bytes("cpu") == 2 * MIB  # calibration reads the same line
    monkeypatch.setattr(hostmem, "MEMINFO", tmp_path / "none")  # not Linux: the check is skipped
    assert hostmem.host_available_bytes() is None
    assert hm.available_bytes("cpu") is None


@pytest.mark.parametrize("text", ["MemTotal: 1 kB\n", "MemAvailable: lots kB\n"])
def test_a_meminfo_without_mem_available_skips_the_check(monkeypatch, tmp_path, text):
    _meminfo(monkeypatch, tmp_path, text)
    assert hostmem.host_available_bytes() is None
