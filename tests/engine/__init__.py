"""Engine tests: the vLLM engine on real small models, model preparation, the worker image pins."""
