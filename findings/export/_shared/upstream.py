"""Loading the upstream module a reproducer exercises, and the names it needs from it."""


def load_names(module, overrides, *names, also_real=()):
    """``(mod, value, ...)``: ``module`` loaded with ``overrides`` (and ``also_real``, see ``load_upstream``), then
    each of ``names`` looked up in it; a name it lacks (or holds as None) stops the script with CannotRun naming
    every missing one."""
    mod = load_upstream(module, overrides=overrides, also_real=also_real)
    values = [getattr(mod, name, None) for name in names]
    missing = [name for name, value in zip(names, values) if value is None]
    if missing:
        raise CannotRun(f"{module} has no {' / '.join(missing)}")
    return (mod, *values)
