"""Hypothesis profiles: ``dev`` (fast, random), ``ci`` (derandomized, bounded, no database writes; chosen when the
``CI`` variable is set) and ``nightly`` (large, persistent example database under ``.smv/hypothesis``)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILES = ("dev", "ci", "nightly")
DATABASE_DIR = os.environ.get("SMV_HYPOTHESIS_DB", os.path.join(".smv", "hypothesis"))

_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


def profile_settings(name: str) -> settings:
    if name == "dev":
        return settings(max_examples=20, database=None, **_COMMON)
    if name == "ci":
        return settings(max_examples=25, derandomize=True, database=None,
                        phases=(Phase.explicit, Phase.generate, Phase.shrink), **_COMMON)
    if name == "nightly":
        return settings(max_examples=2000, database=DirectoryBasedExampleDatabase(DATABASE_DIR), **_COMMON)
    raise ValueError(f"profile: expected one of {', '.join(PROFILES)}, got {name!r}")


def default_profile() -> str:
    return os.environ.get("SMV_PROFILE") or ("ci" if os.environ.get("CI") else "dev")


def register_profiles() -> None:
    for name in PROFILES:
        settings.register_profile(name, profile_settings(name))
