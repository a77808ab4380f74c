"""Reading the user's TOML / YAML / JSON files: any failure is one line naming the flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ppsim.errors import PPSimError

SUFFIXES = (".toml", ".yaml", ".yml", ".json")


def read_mapping(path: str | Path, flag: str, what: str, suffixes: tuple[str, ...] = SUFFIXES) -> dict[str, Any]:
    """The mapping in ``path`` (by suffix; anything else is read as JSON if ``.json`` is allowed)."""
    p = Path(path)
    if p.suffix not in suffixes and ".json" not in suffixes:
        raise PPSimError(f"{flag}: {path} must end in {', '.join(suffixes)}")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise PPSimError(f"{flag}: cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise PPSimError(f"{flag}: {path} is not UTF-8 text (byte {err.start}); save it as UTF-8") from None
    try:
        if p.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as err:  # noqa: BLE001 - any parse error becomes one line
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PPSimError(f"{flag}: cannot parse {path}: {first}") from None
    if not isinstance(data, dict):
        raise PPSimError(f"{flag}: {path} must hold a mapping of {what}")
    return data
