"""Chat templates written for this project's models: a model's `chat_template: "nightbatch:<file>"` names one."""

from __future__ import annotations

from pathlib import Path

PREFIX = "nightbatch:"
DIRECTORY = Path(__file__).resolve().parent


def resolve_chat_template(value: str | None) -> str | None:
    """What vLLM's --chat-template takes: a "nightbatch:<file>" becomes that file's path; anything else (a
    path, or the template itself) is passed on unchanged."""
    if value is None or not value.startswith(PREFIX):
        return value
    name = value.removeprefix(PREFIX)
    path = DIRECTORY / name
    if not name or path.parent != DIRECTORY or not path.is_file():
        shipped = ", ".join(sorted(PREFIX + p.name for p in DIRECTORY.glob("*.jinja")))
        raise ValueError(f"chat_template {value!r} is not a template shipped with nightbatch ({shipped})")
    return str(path)
