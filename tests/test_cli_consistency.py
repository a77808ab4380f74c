"""One vocabulary across commands: --help lists them all, --version, --output-dir everywhere, and
``import-vidur`` says where its data comes from instead of assuming a path on the build machine."""

from __future__ import annotations

import argparse

import pytest

from ppsim.cli import build_parser, main
from tests.vidur_data import PRESENT, SKIP_REASON, VIDUR_ROOT

WRITERS = ("simulate", "sweep", "calibrate", "import-vidur", "engine", "validate")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_help_lists_every_command_with_a_one_line_description(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in action._choices_actions}
    assert set(helps) == set(action.choices) and len(helps) >= 11
    for name, text in helps.items():
        assert text and "\n" not in text and len(text) <= 110, name
        assert name in out and text.split()[0] in out, name


def test_version(capsys):
    from ppsim import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"ppsim {__version__}"


@pytest.mark.parametrize("command", WRITERS)
def test_every_writing_command_takes_output_dir(command):
    flags = {s for a in _subparsers()[command]._actions for s in a.option_strings}
    assert "--output-dir" in flags


@pytest.mark.parametrize("command", ["calibrate", "import-vidur"])
def test_output_is_an_alias_of_output_dir(command):
    p = _subparsers()[command]
    base = ["--model", "tiny"]
    assert p.parse_args([*base, "--output", "a"]).output == p.parse_args([*base, "--output-dir", "a"]).output == "a"


def test_import_vidur_without_root_names_the_source_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PPSIM_VIDUR_ROOT", raising=False)
    out = tmp_path / "prof"
    rc = main(["import-vidur", "--model", "llama-2-7b", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "--root" in err and "PPSIM_VIDUR_ROOT" in err and "data/profiling" in err and "vidur" in err
    assert not out.exists()


def test_import_vidur_root_that_is_not_vidur_data_is_refused(tmp_path, capsys):
    out, root = tmp_path / "prof", tmp_path / "data"  # apart: an output inside --root is refused first
    root.mkdir()
    rc = main(["import-vidur", "--root", str(root), "--model", "llama-2-7b", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and f"--root: {root} has no compute/ folder" in err and "data/profiling" in err
    assert not out.exists()


def test_import_vidur_help_names_the_environment_variable(capsys):
    with pytest.raises(SystemExit):
        main(["import-vidur", "--help"])
    assert "PPSIM_VIDUR_ROOT" in capsys.readouterr().out.replace("\n", " ")


@pytest.mark.skipif(not PRESENT, reason=SKIP_REASON)
def test_import_vidur_reads_the_root_from_the_environment(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PPSIM_VIDUR_ROOT", str(VIDUR_ROOT))
    rc = main(["import-vidur", "--device", "h100", "--model", "llama-2-7b", "--output-dir", str(tmp_path / "p")])
    assert rc == 0, capsys.readouterr().err
    assert (tmp_path / "p" / "fits.json").is_file()
