"""Stored reproducers outlive the generators: a case kind that gains a field keeps replaying the cases stored before
it (fuzz.cases.Case.ADDED_FIELDS), while every other field stays required."""
import dataclasses
import importlib
import pkgutil

import pytest

import fuzz
from fuzz.cases import Case, CaseError


def _case_kinds():
    for m in pkgutil.iter_modules(fuzz.__path__):
        importlib.import_module(f"fuzz.{m.name}")
    todo, seen = list(Case.__subclasses__()), []
    while todo:
        c = todo.pop()
        seen.append(c)
        todo += c.__subclasses__()
    return sorted(seen, key=lambda c: (c.__module__, c.__name__))


KINDS = _case_kinds()


@pytest.mark.parametrize("kind", [k for k in KINDS if k.ADDED_FIELDS], ids=lambda k: k.__name__)
def test_each_added_field_exists_and_has_a_default(kind):
    fields = {f.name: f for f in dataclasses.fields(kind)}
    for name in kind.ADDED_FIELDS:
        assert name in fields, f"{kind.__name__}.ADDED_FIELDS names {name!r}, not a field"
        f = fields[name]
        assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING, \
            f"{kind.__name__}.{name} is in ADDED_FIELDS but has no default to replay older cases with"


def test_a_decode_case_stored_before_the_layout_fields_replays_with_their_defaults():
    from fuzz.decode import DecodeCase
    case = DecodeCase(batch=2, heads=1, main_bs=1, extra_bs=1, main_lens=(1, 2), extra_lens=None, invalid_rate=0.0,
                      indptr_offset=0, tail_junk=0, scale=0.03125, sink="none", poison="none", padded=True,
                      q_transposed=True, cu_count=4, seed=3)
    doc = case.to_json()
    old = {k: v for k, v in doc.items() if k not in DecodeCase.ADDED_FIELDS}
    assert len(old) == len(doc) - len(DecodeCase.ADDED_FIELDS)
    back = DecodeCase.from_json(old)
    assert back == case
    assert back.q_layout is None and back.cache_layout is None  # q_transposed and padded say, as they did


def test_a_field_not_named_as_added_is_still_required():
    from fuzz.decode import DecodeCase
    case = DecodeCase(batch=1, heads=1, main_bs=1, extra_bs=1, main_lens=(1,), extra_lens=None, invalid_rate=0.0,
                      indptr_offset=0, tail_junk=0, scale=0.03125, sink="none", poison="none", padded=False,
                      q_transposed=False, cu_count=4, seed=0)
    doc = case.to_json()
    del doc["tail_junk"]
    with pytest.raises(CaseError, match="missing field tail_junk"):
        DecodeCase.from_json(doc)
