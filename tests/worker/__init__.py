"""Tests of the GPU worker: the shard runner, its entry point, crash safety."""
