"""The context an adapter runs upstream's code in: one target's fresh import of the tree (``contracts.subjects.vllm``
builds it; adapters that need a second import, e.g. with another fp8 format, build one here too)."""
from __future__ import annotations

from contracts.subjects.base import Subject
from impl.targets import Target


class BoundContext:
    """What an adapter gets: the target, its fresh import of upstream's modules, and :meth:`call`."""

    def __init__(self, subject: Subject, target: Target, loaded):
        self.subject = subject
        self.target = target
        self.loaded = loaded

    def __getitem__(self, short: str):
        return self.loaded[short]

    def path_of(self, short: str) -> str:
        """The path of the module a short name stands for in this subject (a model variant's own, if it remaps
        it)."""
        return self.loaded.path_of(short)

    def call(self, fn, *args, **kwargs):
        """Run upstream's ``fn`` with this target's modules active (and, under the interpreter, corrected)."""
        from contracts.subjects import fidelity

        with self.loaded.active(), fidelity.corrected():
            return fn(*args, **kwargs)
