"""The engine: plan (rows, minimums, budget shares, change selection) -> execute (in process or on a pool of
workers, one interface, crash and hang isolation) -> record (journal, audit/campaign/zoo reports).

Importing it installs the oracles' timers (the per-row ``time_split`` of audit.json); the contracts and subjects
below it never import it."""

from contracts.engine import timesplit as _timesplit

_timesplit.install()
