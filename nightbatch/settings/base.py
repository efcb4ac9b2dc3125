"""What every settings section is built from: the section base, the variable-name marker and the prefix."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

ENV_PREFIX = "NIGHTBATCH_"


class Env:
    """Marks a section field whose environment variable is not NIGHTBATCH_<FIELD> (`Annotated[int, Env("X")]`)."""

    def __init__(self, name: str) -> None:
        self.name = name  # the setting name: the variable without its prefix, lower-cased


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def env_var(name: str) -> str:
    """The environment variable a setting (or a job input) of that name is read from."""
    return ENV_PREFIX + name.upper()
