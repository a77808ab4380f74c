"""Reading the user's TOML / YAML / JSON files: any failure is one line naming the flag.

Only regular files are read (``/dev/zero`` or a FIFO would be read without end), and none larger
than a limit: a scenario or HF ``config.json`` is a few KiB, so 16 MiB is far more than any
real one; a trace of a billion requests is ~30 GiB, so traces are capped at 1 GiB.
"""

from __future__ import annotations

import errno
import json
import os
import reprlib
import stat
from pathlib import Path
from typing import Any

from ppsim.errors import PPSimError
from ppsim.units import GIB, MIB

SUFFIXES = (".toml", ".yaml", ".yml", ".json")
MAX_MAPPING_BYTES = 16 * MIB  # scenario, sweep space and HF config.json files
MAX_TRACE_BYTES = GIB  # trace CSV files
REPR_CHARS = 100  # a value quoted in an error message: at most this many characters
MAX_MESSAGE_CHARS = 400  # a field name or message quoting a huge value is cut to this


def cut_text(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, ``...`` marking the cut."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short_repr(value: Any, limit: int = REPR_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, without building the whole repr first (a YAML alias
    bomb of a few hundred bytes is a list of 10^8 strings)."""
    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 3, 6, 6, 4, 6
    r.maxstring = r.maxother = r.maxlong = limit
    try:
        text = r.repr(value)
    except ValueError:  # an int of more than 4300 digits has no repr
        text = f"<{type(value).__name__}>"
    return cut_text(text, limit)


def permission_fix(err: OSError) -> str:
    """The fix to append to a message about ``err`` if its cause is permissions (a file that cannot be
    read, a directory above it that cannot be searched); else ``""``."""
    return "; fix the permissions of it or of a directory above it" if err.errno in (errno.EACCES, errno.EPERM) else ""


def os_error(flag: str, verb: str, path: str | Path, err: OSError) -> PPSimError:
    """``FLAG: cannot VERB PATH: why``, with the fix if the cause is permissions."""
    return PPSimError(f"{flag}: cannot {verb} {path}: {err.strerror or err}{permission_fix(err)}")


def check_regular_file(path: str | Path, flag: str, limit_bytes: int) -> None:
    """Refuse ``path`` unless it is a readable regular file of at most ``limit_bytes``."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise os_error(flag, "read", path, err) from None
    except ValueError:  # an embedded NUL byte
        raise PPSimError(f"{flag}: the path {str(path)!r} contains a NUL byte; fix the path") from None
    if not stat.S_ISREG(st.st_mode):
        raise PPSimError(f"{flag}: {path} is not a regular file; give the path of a file")
    if st.st_size > limit_bytes:
        raise PPSimError(
            f"{flag}: {path} is {st.st_size / MIB:.0f} MiB, more than the {limit_bytes // MIB} MiB limit; "
            "is it the right file?"
        )


def read_text(path: str | Path, flag: str, limit_bytes: int = MAX_MAPPING_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit_bytes``."""
    check_regular_file(path, flag, limit_bytes)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(limit_bytes + 1)  # the file may have grown since the check
    except OSError as err:
        raise os_error(flag, "read", path, err) from None
    except UnicodeDecodeError as err:
        raise PPSimError(f"{flag}: {path} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    if len(text) > limit_bytes:
        raise PPSimError(f"{flag}: {path} is more than the {limit_bytes // MIB} MiB limit; is it the right file?")
    return text


class DuplicateKey(ValueError):
    """A mapping key given twice in one file (JSON and YAML parsers keep the last one silently)."""


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise DuplicateKey(f"key {short_repr(k)} appears twice in one object; keep one")
        seen[k] = v
    return seen


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses a key given twice in one object."""
    return json.loads(text, object_pairs_hook=_unique_pairs)


def loads_yaml(text: str) -> Any:
    """``yaml.safe_load`` that refuses a key given twice in one mapping (a ``<<`` merge may still be
    overridden by the mapping's own keys, as YAML says)."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = loader.construct_object(key_node, deep=deep)
            try:
                dup = key in seen
            except TypeError:  # an unhashable key: the constructor below names it
                continue
            if dup:
                line = key_node.start_mark.line + 1
                raise DuplicateKey(f"key {short_repr(key)} appears twice in one mapping (line {line}); keep one")
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_mapping(path: str | Path, flag: str, what: str, suffixes: tuple[str, ...] = SUFFIXES) -> dict[str, Any]:
    """The mapping in ``path`` (by suffix; anything else is read as JSON if ``.json`` is allowed)."""
    p = Path(path)
    if p.suffix not in suffixes and ".json" not in suffixes:
        raise PPSimError(f"{flag}: {path} must end in {', '.join(suffixes)}")
    text = read_text(p, flag)
    try:
        if p.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            data = loads_yaml(text)
        else:
            data = loads_json(text)
    except Exception as err:  # noqa: BLE001 - any parse error becomes one line
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PPSimError(f"{flag}: cannot parse {path}: {first}") from None
    if not isinstance(data, dict):
        raise PPSimError(f"{flag}: {path} must hold a mapping of {what}")
    return data
