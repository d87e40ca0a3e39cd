"""Executable contracts (one module per impl module they check) and their core API (``contracts.core``,
``contracts.registry``); beside them the engine (``contracts.engine``), the command-line front ends
(``contracts.cli``), the pytest plugin (``contracts.plugin``), the code under audit (``contracts.subjects``) and
the planted-bug zoo (``contracts.zoo``).

Note: the name is generic (PyPI's PyContracts also imports as ``contracts``); install the suite in its own
virtual environment.
"""
