"""Batches: create, read, cancel, the lifecycle, options, retry, estimate and cost."""
