"""Typed cases: every contract's case family is one frozen dataclass built on :class:`Case`.

A case is what a strategy draws and what a reproducer stores. ``to_json`` writes every field plus ``kind`` and
``schema_version``; ``from_json`` is strict: every field must be present (defaults exist for the strategies, and
for the fields a case kind names in ``ADDED_FIELDS``: added after its cases were first stored, their defaults replay
those cases),
no unknown field is accepted, each value is checked against the field's annotation, and the schema version must be
the one this code writes. Any problem is a :class:`CaseError` (a ``ValueError``) naming the field, so a malformed
reproducer is a usage error, never a contract violation.

Supported annotations: ``int``, ``float`` (an int is accepted), ``bool``, ``str``, ``X | None``, ``tuple[X, ...]``,
``tuple[X, Y]``, ``dict[str, X]``, ``typing.Any`` (plain JSON), ``Literal[...]`` and nested :class:`Case` types.
Lists become tuples so that a case is immutable all the way down.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, Literal, Union

CASE_SCHEMA_VERSION = 1


class CaseError(ValueError):
    """A case document that this code cannot replay: names the case kind and the field."""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(value, tp, where: str):
    """``value`` (decoded JSON) checked against annotation ``tp`` and converted (lists -> tuples, dicts -> Cases)."""
    if tp is Any:
        return _freeze(value)
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise CaseError(f"{where}: may not be null")
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(value, a, where)
            except CaseError as exc:
                errors.append(str(exc))
        raise CaseError(errors[0] if len(errors) == 1 else f"{where}: {value!r} matches none of "
                        f"{', '.join(_type_name(a) for a in args)}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise CaseError(f"{where}: expected one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise CaseError(f"{where}: expected a list, got {type(value).__name__}")
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise CaseError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(_convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise CaseError(f"{where}: expected an object, got {type(value).__name__}")
        _, vt = typing.get_args(tp)
        return {str(k): _convert(v, vt, f"{where}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and issubclass(tp, Case):
        if isinstance(value, tp):
            return value
        return tp._from_fields(value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise CaseError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise CaseError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CaseError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise CaseError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{where}: unsupported case field annotation {tp!r}")  # a programming error, not bad input


def _freeze(value):
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    return value


def _to_json_value(value):
    if isinstance(value, Case):
        return value._fields_json()
    if isinstance(value, (list, tuple)):
        return [_to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_json_value(v) for k, v in value.items()}
    return value


@dataclasses.dataclass(frozen=True)
class Case:
    """Base of every case family. Subclasses are ``@dataclass(frozen=True)`` and set ``KIND``."""

    KIND: ClassVar[str] = ""
    #: fields added after this case kind was first stored: a stored case without one was drawn before it existed, and
    #: the field's default reproduces what that case ran, so older reproducers replay unchanged (every other field
    #: stays required; tests/test_cases.py checks each one named here has a default)
    ADDED_FIELDS: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self):
        # strategies may hand lists; store tuples so the case is immutable all the way down
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, list):
                object.__setattr__(self, f.name, _freeze(v))

    # --- JSON --------------------------------------------------------------------------------------------------
    def _fields_json(self) -> dict:
        return {f.name: _to_json_value(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def to_json(self) -> dict:
        return {"kind": self.KIND, "schema_version": CASE_SCHEMA_VERSION, **self._fields_json()}

    @classmethod
    def _hints(cls) -> dict:
        cache = cls.__dict__.get("_hints_cache")
        if cache is None:
            cache = typing.get_type_hints(cls)
            setattr(cls, "_hints_cache", cache)
        return cache

    @classmethod
    def _from_fields(cls, doc, where: str):
        if not isinstance(doc, dict):
            raise CaseError(f"{where}: expected an object, got {type(doc).__name__}")
        hints = cls._hints()
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in doc and n not in cls.ADDED_FIELDS]
        if missing:
            raise CaseError(f"{where}: missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
        unknown = sorted(set(doc) - set(names) - {"kind", "schema_version"})
        if unknown:
            raise CaseError(f"{where}: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
        values = {n: _convert(doc[n], hints[n], f"{where}.{n}") for n in names if n in doc}
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise CaseError(f"{where}: {exc}") from None

    @classmethod
    def from_json(cls, doc) -> "Case":
        """The case a reproducer stored; strict (see the module docstring)."""
        kind = cls.KIND or cls.__name__
        if not isinstance(doc, dict):
            raise CaseError(f"{kind} case: expected an object, got {type(doc).__name__}")
        version = doc.get("schema_version")
        if version != CASE_SCHEMA_VERSION:
            raise CaseError(f"{kind} case: schema_version {version!r} is not the supported {CASE_SCHEMA_VERSION}")
        if doc.get("kind") != cls.KIND:
            raise CaseError(f"{kind} case: kind {doc.get('kind')!r} is not {cls.KIND!r}")
        return cls._from_fields(doc, f"{kind} case")

    def replace(self, **changes) -> "Case":
        return dataclasses.replace(self, **changes)
