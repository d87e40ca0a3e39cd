"""Executable contracts, the audit runner and the planted-bug zoo.

Note: the name is generic (PyPI's PyContracts also imports as ``contracts``); install the suite in its own
virtual environment.
"""

from contracts import timesplit as _timesplit

_timesplit.install()  # the oracles' public functions report their time to a running row (audit.json time_split)
