"""Inference engines behind one small interface; only the vLLM module imports vllm."""
