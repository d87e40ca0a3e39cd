"""The command-line front ends of the engine: ``smv`` (:mod:`contracts.cli.smv`), ``smv bench``
(:mod:`contracts.cli.bench`) and ``smv mutate`` (:mod:`contracts.cli.mutate`)."""


def main(argv=None) -> int:
    """The ``smv`` console script (imported on call, so ``contracts.cli.bench`` alone stays light)."""
    from contracts.cli.smv import main as smv_main

    return smv_main(argv)
