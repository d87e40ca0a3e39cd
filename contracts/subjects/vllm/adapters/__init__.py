"""Adapters from our API to upstream's calls, one module per family (named after impl's modules). Each module
defines ``build(ctx: contracts.subjects.vllm.BoundContext) -> contracts.subjects.Family``; an entry point a
family leaves out is ``EntryMissing`` (a ``skipped`` row naming it)."""
