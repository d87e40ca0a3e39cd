"""The planted-bug zoo: source patches each contract must catch. See README.md beside this file."""
