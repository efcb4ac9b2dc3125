"""GPU worker: the shard runner and the vLLM engine it drives."""
