"""Pinned versions the GPU image and the CPU engine must agree on (tests check Dockerfile and pyproject)."""

VLLM_VERSION = "0.32.0"
