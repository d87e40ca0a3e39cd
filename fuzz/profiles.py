"""Hypothesis profiles: ``dev`` (fast, random), ``ci`` (derandomized, bounded, no database writes; chosen when the
``CI`` variable is set) and ``nightly`` (large, persistent example database: ``.smv/hypothesis`` by default, or the
folder or ``redis://HOST:PORT/DB`` that ``SMV_HYPOTHESIS_DB`` names, so every process of a campaign, and every host
of a sharded one, replays what any of them found)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

PROFILES = ("dev", "ci", "nightly")
DATABASE_DIR = os.path.join(".smv", "hypothesis")
#: the example database of the nightly profile: a folder, or ``redis://HOST:PORT/DB`` (the ``redis`` extra)
DATABASE_ENV = "SMV_HYPOTHESIS_DB"
#: the prefix of every key the suite writes into a shared Redis server
REDIS_KEY_PREFIX = b"smv-hypothesis:"


def database_spec() -> str:
    return os.environ.get(DATABASE_ENV) or DATABASE_DIR


def check_database_spec(spec: str) -> str:
    """``spec`` as given when it names a usable example database, else a ValueError that says what is wrong."""
    spec = str(spec).strip()
    if not spec:
        raise ValueError("database: expected a folder or redis://HOST:PORT/DB, got an empty string")
    if "://" in spec:
        if not spec.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"database: expected a folder or redis://HOST:PORT/DB, got {spec!r}")
        try:
            import redis  # noqa: F401
            from hypothesis.extra.redis import RedisExampleDatabase  # noqa: F401
        except ImportError as exc:
            raise ValueError(f"database {spec}: a Redis database needs the `redis` package "
                             f"(pip install 'sparse-mla-verify[redis]'): {exc}") from None
        from urllib.parse import urlparse

        u = urlparse(spec)
        if u.scheme != "unix" and not u.hostname:
            raise ValueError(f"database: expected redis://HOST:PORT/DB, got {spec!r} (no host)")
    elif os.path.exists(spec) and not os.path.isdir(spec):
        raise ValueError(f"database: {spec} exists and is not a folder")
    return spec


_databases: dict = {}


def example_database(spec: str | None = None):
    """The Hypothesis example database ``spec`` names (default :func:`database_spec`): one object per spec and
    process. Redis is Hypothesis' own ``RedisExampleDatabase`` under the suite's key prefix."""
    spec = check_database_spec(spec or database_spec())
    if spec not in _databases:
        if "://" in spec:
            import redis
            from hypothesis.extra.redis import RedisExampleDatabase

            _databases[spec] = RedisExampleDatabase(redis.Redis.from_url(spec), key_prefix=REDIS_KEY_PREFIX)
        else:
            _databases[spec] = DirectoryBasedExampleDatabase(spec)
    return _databases[spec]

_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


def profile_settings(name: str) -> settings:
    if name == "dev":
        return settings(max_examples=20, database=None, **_COMMON)
    if name == "ci":
        return settings(max_examples=25, derandomize=True, database=None,
                        phases=(Phase.explicit, Phase.generate, Phase.shrink), **_COMMON)
    if name == "nightly":
        return settings(max_examples=2000, database=example_database(), **_COMMON)
    raise ValueError(f"profile: expected one of {', '.join(PROFILES)}, got {name!r}")


def default_profile() -> str:
    return os.environ.get("SMV_PROFILE") or ("ci" if os.environ.get("CI") else "dev")


def register_profiles() -> None:
    for name in PROFILES:
        settings.register_profile(name, profile_settings(name))
