"""nightbatch: a self-hosted, OpenAI-compatible Batch API (the core package)."""

# The release; pyproject.toml reads it. 0.1.x wrote the older forms of the hand-off records that 0.2 still reads
# (docs/ARCHITECTURE.md "Versions of the hand-off records").
__version__ = "0.2.0"
