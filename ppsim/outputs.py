"""Result directories: checked before any work, written whole or not at all.

Every command that writes a set of results (``simulate``, ``engine``, ``validate``, ``sweep``,
``calibrate``, ``import-vidur``) builds all its files in memory, then calls
:func:`write_result_set`: the files go into a temporary sibling directory ``.NAME.tmp-PID``,
which is renamed onto ``NAME`` at the end. A previous result directory there is moved aside first
and removed only once the new one is in place, so a run that fails (bad input, a fault, a full
disk, Ctrl-C) leaves the previous results as they were and never a partial set; the temporary
directory is removed on every path.

Which directories may be replaced: a missing or empty one, or one a ppsim command wrote (it holds
the marker file ``.ppsim-result``, or, for results written before the marker existed, nothing but
what ppsim writes, folders included). A directory holding anything else is refused before the run,
so ``--output-dir .`` in a source tree or a home directory never deletes a file, and so is one that
is, holds or lies inside a path the command reads (``--profile``, ``--trace``, ...).
:func:`check_output_dir` makes the same checks up front (one line, exit 2) so that a bad path is
found before minutes of simulation.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from ppsim.errors import PPSimError
from ppsim.fileio import os_error

MARKER = ".ppsim-result"
# the files ppsim commands wrote into a result directory before the marker existed (and into its
# run and profile folders: validate's engine-N/, sim/ and profile/)
KNOWN_NAMES = {
    "summary.json",
    "requests.csv",
    "tokens.csv",
    "stage_ops.csv",
    "stage_loop.csv",
    "trace.json",
    "config.json",
    "engine.json",
    "tokens.json",
    "validation.json",
    "latency_cdf.png",
    "trace_combined.json",
    "meta.json",
    "fits.json",
    "samples.csv",
    "sweep.csv",
    "space.json",
    "pareto.png",
    "dashboard.png",
    MARKER,
}
KNOWN_DIRS = re.compile(r"engine-\d+|sim|profile")  # holding known names only
SWEEP_RESULTS, SWEEP_RESULT = "results", re.compile(r"[0-9a-f]+\.json")  # a sweep's OUT/results/KEY.json
TEMP_PATTERN = re.compile(r"\..*\.tmp-?\d+")  # a staging directory or an atomic write's temporary file


class OutputError(PPSimError):
    """Writing the results failed (disk full, permissions changed mid-run): one line, exit status 1."""

    exit_code = 1


def _abs(out: str | Path, flag: str, example: str = "a directory such as ppsim-results") -> Path:
    if str(out).strip() == "":
        raise PPSimError(f"{flag}: empty path; give {example}")
    if "\0" in str(out):
        raise PPSimError(f"{flag}: {str(out)!r} holds a NUL character; give a plain path")
    d = Path(os.path.abspath(os.path.expanduser(str(out))))
    if os.path.islink(d):
        d = Path(os.path.realpath(d))  # never raises; a loop leaves a link
        if os.path.islink(d):
            raise PPSimError(f"{flag}: {out} is a symlink loop; remove the links or pick another path")
    if d.parent == d:
        raise PPSimError(f"{flag}: {d} cannot hold results; give a directory such as ppsim-results")
    return d


def _check_names(path: Path, flag: str, staged: str) -> None:
    """Refuse a path the file system cannot name: a component (or ``staged``, the longest sibling name
    a writer makes beside ``path``) longer than its name limit, or a path longer than its path limit."""
    anc = _existing_ancestor(path.parent)
    try:
        name_max = os.pathconf(anc, "PC_NAME_MAX")
        path_max = os.pathconf(anc, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    too_long = next((n for n in (*path.parts[1:], staged) if len(os.fsencode(n)) > name_max), None)
    if too_long is not None:
        raise PPSimError(
            f"{flag}: a name in {path} is {len(os.fsencode(too_long))} bytes long, above this file system's "
            f"{name_max}; pick a shorter name"
        )
    if len(os.fsencode(str(path))) + len(os.fsencode(staged)) >= path_max:
        raise PPSimError(f"{flag}: {path} is longer than this file system's {path_max}-byte paths; pick a shorter one")


def _existing_ancestor(d: Path) -> Path:
    p = d
    while not _lexists(p) and p.parent != p:
        p = p.parent
    return p


def _lexists(p: Path) -> bool:
    try:
        os.lstat(p)
    except (OSError, ValueError):
        return False
    return True


def _can_create(where: Path) -> OSError | None:
    """Create and remove a directory in ``where`` (the only test that holds for root and /proc too);
    the error if that fails."""
    probe = where / f".ppsim-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        return err
    return None


def is_result_dir(d: Path) -> bool:
    """True if ``d`` is empty or was written by a ppsim command (so replacing it loses nothing else)."""
    names = [p.name for p in d.iterdir()]
    return not names or MARKER in names or not foreign_entries(d)


def foreign_entries(d: Path) -> list[str]:
    """What in ``d`` (a directory without the marker) ppsim does not write, as paths relative to ``d``,
    sorted: anything but the known file names, temporary files, and the folders of a result set
    (``engine-N/``, ``sim/``, ``profile/`` holding known names, a sweep's ``results/KEY.json``)."""
    out = []
    for p in sorted(d.iterdir()):
        if _is_dir(p) and (KNOWN_DIRS.fullmatch(p.name) or p.name == SWEEP_RESULTS):
            out += [f"{p.name}/{q.name}" for q in sorted(p.iterdir()) if not _is_ppsim_file(q, p.name)]
        elif not _is_ppsim_file(p, ""):
            out.append(p.name)
    return out


def _is_dir(p: Path) -> bool:
    return p.is_dir() and not p.is_symlink()


def _is_ppsim_file(p: Path, folder: str) -> bool:
    """A temporary file or directory, or a regular file (ppsim writes no links) of a name ppsim writes in
    ``folder`` (``""``: the result directory itself)."""
    if TEMP_PATTERN.fullmatch(p.name):
        return True
    known = SWEEP_RESULT.fullmatch(p.name) if folder == SWEEP_RESULTS else p.name in KNOWN_NAMES
    return bool(known) and p.is_file() and not p.is_symlink()


def check_output_dir(
    out: str | Path,
    flag: str = "--output-dir",
    names: Iterable[str] = (),
    replace: bool = True,
    inputs: Mapping[str, str | Path] | None = None,
) -> Path:
    """Raise (one line) unless the results can be written to ``out``; return it as an absolute path.

    ``names``: the files about to be written (one taken by a directory is refused). ``replace``:
    the directory is replaced whole, so it must be empty or a previous ppsim result. ``inputs``: the
    paths the command reads, by flag (``{"--profile": "p"}``); ``out`` may not be, hold or lie inside one.
    """
    try:
        return _check_output_dir(out, flag, names, replace, inputs or {})
    except OSError as err:  # ``out`` cannot be read, or a directory above it cannot be searched
        raise os_error(flag, "access", err.filename or out, err) from None


def check_apart(
    out: Path, flag: str, inputs: Mapping[str, str | Path], replace: bool = True, names: Iterable[str] = ()
) -> None:
    """Refuse an output directory that is, holds or lies inside one of ``inputs`` (flag -> path read):
    the result set replaces the directory whole, so a profile, a checkpoint or a trace there would be
    lost, and results written inside an input would change it. A set written with ``replace=False``
    (a sweep's folder, ``compare.png``) only adds files and removes nothing it holds: holding an input is
    refused only where one of the files written (``names``) would overwrite it."""
    d = Path(os.path.realpath(out))
    written = set(names)
    for name, path in inputs.items():
        if not str(path).strip():  # an empty path (not the current directory): its reader refuses it
            continue
        try:
            p = Path(os.path.realpath(os.path.expanduser(str(path))))
        except ValueError:  # a NUL in the path: its reader refuses it
            continue
        if p == d:
            what = f"is also {name}"
            fix = (
                "the results would replace it; pick another directory"
                if replace
                else "the results would be written into it; pick another directory"
            )
        elif d in p.parents:
            if not replace and p.relative_to(d).parts[0] not in written:
                continue  # the files written lie beside it
            what = f"holds {name} {p}"
            fix = f"the results would {'replace' if replace else 'overwrite'} it; pick another directory"
        elif p in d.parents:
            what, fix = f"lies inside {name} {p}", "the results would change it; pick a directory outside it"
        else:
            continue
        raise PPSimError(f"{flag}: {d} {what}; {fix}")


def _check_output_dir(
    out: str | Path, flag: str, names: Iterable[str], replace: bool, inputs: Mapping[str, str | Path]
) -> Path:
    d = _abs(out, flag)
    names = tuple(names)  # read twice
    check_apart(d, flag, inputs, replace, names)
    _check_names(d, flag, f".{d.name}.tmp-{os.getpid()}")
    if d.exists() and not d.is_dir():
        raise PPSimError(f"{flag}: {d} exists and is not a directory; remove it or pick another path")
    anc = _existing_ancestor(d)
    _check_ancestor(d, anc, flag)
    # the set is staged beside ``d``, or inside it when only ``d`` itself is writable
    if not d.exists():
        err = _can_create(anc)
    else:
        err = _can_create(d.parent)
        err = _can_create(d) if err is not None else None
    if err is not None:
        where = anc if not d.exists() else d
        raise PPSimError(f"{flag}: cannot create {d}: {where} is not writable ({err.strerror}); pick another directory")
    if d.exists():
        for name in names:
            if (d / name).is_dir():
                raise PPSimError(
                    f"{flag}: {d / name} is a directory where the result file {name} goes; "
                    "remove it or pick another directory"
                )
        if replace and not is_result_dir(d):
            others = foreign_entries(d)
            more = ", ..." if len(others) > 3 else ""
            raise PPSimError(
                f"{flag}: {d} is not a ppsim result directory (it holds {', '.join(others[:3])}{more}) "
                "and would be replaced; pick a new or empty directory"
            )
    return d


def _check_ancestor(path: Path, anc: Path, flag: str) -> None:
    """``anc``, the nearest existing ancestor of ``path``, must be a directory."""
    if anc.is_dir():
        return
    if anc.is_symlink() and not anc.exists():
        raise PPSimError(f"{flag}: cannot create {path}: {anc} is a dangling symlink or a symlink loop")
    raise PPSimError(f"{flag}: cannot create {path}: {anc} is a file, not a directory; pick another path")


def check_output_file(out: str | Path, flag: str) -> Path:
    """Raise (one line) unless a file can be written atomically at ``out`` (as
    :func:`ppsim.metrics.io.atomic_write` does: a temporary file beside it, then a rename); return it
    as an absolute path. Checked before the work whose result it is."""
    try:
        return _check_output_file(out, flag)
    except OSError as err:  # a directory above ``out`` cannot be searched
        raise os_error(flag, "access", err.filename or out, err) from None


def _check_output_file(out: str | Path, flag: str) -> Path:
    p = _abs(out, flag, "a PNG file such as plot.png")
    tmp_name = f".{p.name}.tmp{os.getpid()}"
    _check_names(p, flag, tmp_name)
    if p.is_dir():
        raise PPSimError(f"{flag}: {p} is a directory; give a file name such as {p / 'plot.png'}")
    if p.exists() and not p.is_file():
        raise PPSimError(f"{flag}: {p} is not a regular file; pick another path")
    anc = _existing_ancestor(p.parent)
    _check_ancestor(p, anc, flag)
    if anc != p.parent:  # the missing directories are created first
        err = _can_create(anc)
    else:
        err = None
        probe = p.parent / tmp_name
        try:
            probe.open("x").close()
            probe.unlink()
        except OSError as e:
            err = e
    if err is not None:
        raise PPSimError(f"{flag}: cannot write {p}: {anc} is not writable ({err.strerror or err}); pick another path")
    return p


def _write_tree(root: Path, files: Mapping[str, str | bytes | Iterable[str]]) -> None:
    for name, content in files.items():
        p = root / name
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                p.write_bytes(content)
            elif isinstance(content, str):
                p.write_text(content, encoding="utf-8")
            else:  # text chunks: a large CSV formatted as it is written (ppsim.metrics.io)
                with open(p, "w", encoding="utf-8") as f:
                    for chunk in content:
                        f.write(chunk)
        except OSError as err:
            err.filename = err.filename or str(p)  # a failed write (ENOSPC) carries no file name
            raise


def write_result_set(
    out: str | Path,
    files: Mapping[str, str | bytes | Iterable[str]],
    flag: str = "--output-dir",
    replace: bool = True,
    derived: Callable[[Path], Mapping[str, str | bytes]] | None = None,
    marker: bool = True,
) -> Path:
    """Write ``files`` (relative name -> text, bytes or an iterable of text chunks) as the directory
    ``out``, all or nothing.

    ``replace=True``: ``out`` becomes exactly these files (an old result directory is replaced whole).
    ``replace=False`` (a sweep's folder, which it resumes from): each file is renamed into ``out``
    and everything else there is kept. Any ``OSError`` is one :class:`OutputError` naming the path.
    ``derived(staging_dir)`` returns more files drawn from the staged ones (the dashboard PNG): they
    join the set before it is moved into place. ``marker=False``: no ``.ppsim-result`` (a folder of
    generated files in a source tree, which only ``replace=False`` should write to).
    """
    top = {n.split("/", 1)[0] for n in files}
    d = check_output_dir(out, flag, [n for n in top if "/" not in n and n in files], replace)
    # staged beside ``d`` (renamed onto it at the end), or inside it if its parent is not writable
    inside = d.exists() and _can_create(d.parent) is not None
    tmp = d / f".ppsim.tmp-{os.getpid()}" if inside else d.parent / f".{d.name}.tmp-{os.getpid()}"
    old = d.parent / f".{d.name}.old-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _write_tree(tmp, files)
        if derived is not None:
            more = derived(tmp)
            _write_tree(tmp, more)
            files = {**files, **more}
        if marker:
            mark = {MARKER: json.dumps({"written_by": "ppsim", "files": sorted(files)}) + "\n"}
            _write_tree(tmp, mark)
            files = {**files, **mark}
        if inside or (d.exists() and not replace):
            _move_into(tmp, d, files, replace)
        else:
            try:
                _swap(tmp, d, old)
            except OSError as err:
                if err.errno not in (errno.EBUSY, errno.EXDEV):  # EBUSY: ``d`` is a mount point
                    raise
                _move_into(tmp, d, files, replace)
    except OSError as err:
        kept = f"; {d} is as it was" if replace and not inside else ""
        where = str(err.filename or d).replace(str(tmp), str(d))  # name the file, not the staging directory
        raise OutputError(f"{flag}: cannot write {where}: {err.strerror or err}{kept}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        with contextlib.suppress(OSError):
            if old.exists() and d.exists():
                shutil.rmtree(old)
    return d


def _swap(tmp: Path, d: Path, old: Path) -> None:
    """Rename ``tmp`` onto ``d``; an existing ``d`` is moved to ``old`` first and back if that fails."""
    if d.exists():
        os.rename(d, old)
    try:
        os.rename(tmp, d)
    except BaseException:
        if old.exists() and not d.exists():
            os.rename(old, d)
        raise


def _move_into(tmp: Path, d: Path, files: Mapping[str, str | bytes], replace: bool) -> None:
    """Rename each staged file into ``d``: a sweep's folder (``replace=False``: nothing else is touched),
    or a directory whose parent is read-only or that is a mount point (``replace=True``: the old
    entries are removed first; a failure here can leave a partial set, the one case that can)."""
    if replace:
        for p in d.iterdir():
            if p != tmp:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for name in files:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(tmp / name, d / name)  # a rename, or a copy across file systems
