"""nightbatch: a self-hosted, OpenAI-compatible Batch API (the core package)."""

__version__ = "0.1.0"
