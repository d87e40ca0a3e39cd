"""Hypothesis strategies, profiles and stateful machines that drive the contracts."""
