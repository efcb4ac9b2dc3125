"""Anthropic's Message Batches API beside OpenAI's: its objects (objects.py), its error object (errors.py), its
result lines made from ours (results.py) and its use cases over the same batches machinery (service.py).
docs/ANTHROPIC.md says what differs."""
