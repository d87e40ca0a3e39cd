"""Executable contracts, the audit runner and the planted-bug zoo.

Note: the name is generic (PyPI's PyContracts also imports as ``contracts``); install the suite in its own
virtual environment.
"""
