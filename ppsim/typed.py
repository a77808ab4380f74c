"""The base of every configuration model: pydantic, plus one rule its lax mode lacks.

Pydantic's lax mode reads ``true`` as 1 in an int or float field, so ``max_num_seqs = true`` in a file
ran a scenario with one sequence. A bool is refused in a field that takes numbers but not bools (flags
never give one: argparse types them from the same fields, ``ppsim.flags``)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator, model_validator


def _members(ann: Any) -> list[Any]:
    """The types an annotation admits: union members, ``Annotated`` unwrapped."""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _members(typing.get_args(ann)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(ann) for m in _members(a)]
    return [ann]


def takes_numbers_not_bools(ann: Any) -> bool:
    members = _members(ann)
    return bool not in members and any(m in (int, float) for m in members)


def _refusal(v: bool) -> str:
    return f"expects a number, not {str(v).lower()}; give a number"


class Model(BaseModel):
    """A configuration model whose number fields refuse ``true`` / ``false``."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_number(cls, v: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(v, bool) and field is not None and takes_numbers_not_bools(field.annotation):
            raise ValueError(_refusal(v))
        return v


class TaggedModel(BaseModel):
    """:class:`Model` for a member of a tagged union (pydantic allows no field validator on the tag):
    the same check on the whole input, the field named in the message."""

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_number(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, v in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if isinstance(v, bool) and field is not None and takes_numbers_not_bools(field.annotation):
                    raise ValueError(f"{name}: {_refusal(v)}")
        return data
