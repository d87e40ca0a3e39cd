"""Subjects: the code under audit - ``ours`` (impl/) and upstream vLLM's real modules (``contracts.subjects.vllm``),
each judged through the same entry points. Everything but :func:`parse_subject` lives in
:mod:`contracts.subjects.base`; the modules of this package import it from there, so nothing here imports back
into the package that imports it."""
from __future__ import annotations

from contracts.subjects.base import (  # noqa: F401 - the package's API
    EntryMissing, Family, FidelityError, OursSubject, Subject, SubjectError, SubjectSkip, SubjectSpecError,
    SubjectUnavailable, SymbolMissing, SymbolNotInVariant, SymbolTooNew, bound, current, failure_cause, is_ours, ours,
    package_version, set_call_timer, using)


def parse_subject(spec: str) -> Subject:
    """``ours``; ``vllm==X`` (downloaded once into the user cache); ``vllm@PATH`` (a checkout or a fetched tree);
    ``vllm`` (the installed package); any of the three vllm specs followed by ``#VARIANT`` (a model variant, e.g.
    ``vllm==0.34.0#deepseek_v41``); ``flashmla`` or ``flashmla@PATH`` (FlashMLA's sparse decode, natively on an
    NVIDIA SM90/SM100 GPU: :mod:`contracts.subjects.flashmla`). Anything else, or a spec that cannot be resolved, is a
    :class:`SubjectSpecError` with one line saying why."""
    s = (spec or "").strip()
    if s in ("", "ours"):
        return ours()
    if s == "vllm" or s.startswith(("vllm==", "vllm@", "vllm#")):
        from contracts.subjects.vllm import vllm_subject

        sub = vllm_subject(s)
        sub.spec = s  # the spec that names it again (a reproducer records it)
        return sub
    if s == "flashmla" or s.startswith("flashmla@"):
        from contracts.subjects.flashmla import flashmla_subject

        sub = flashmla_subject(s)
        sub.spec = s
        return sub
    raise SubjectSpecError(f"unknown subject {spec!r}: expected ours, vllm==VERSION, vllm@PATH or vllm "
                           f"(each optionally #VARIANT), flashmla or flashmla@PATH")
