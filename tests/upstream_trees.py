"""A vLLM release's audited modules for the tests that read upstream's files directly: the extracted tree in the
checkout (``.smv-subject/vllm-X``) when it holds the module a test needs, else the user cache's (downloaded once);
a host that can reach neither skips the test, saying why."""
from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def release_tree(release: str, needs: str) -> str:
    local = ROOT / ".smv-subject" / f"vllm-{release}"
    if (local / needs).exists():
        return str(local)
    from contracts.subjects import SubjectSpecError, parse_subject

    try:
        return parse_subject(f"vllm=={release}").tree.root
    except SubjectSpecError as exc:
        pytest.skip(f"the vllm=={release} subject is unavailable here: {exc}")
