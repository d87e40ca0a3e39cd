"""Slow reference implementations on the CPU, written from SPEC.md and independent of ``impl/``.

They import nothing of ours except the pure layout constants and codecs of ``impl.formats``, and re-derive anything
they check bitwise. float64 throughout, except where an oracle mirrors a kernel's fp32 steps on purpose.
"""
