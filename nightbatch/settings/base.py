"""What every settings section is built from: the section base, the variable-name marker, the prefix, and the
parsers of the settings whose variable holds JSON or a comma-separated list."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, TypeAdapter, ValidationError

ENV_PREFIX = "NIGHTBATCH_"
T = TypeVar("T")


class Env:
    """Marks a section field whose environment variable is not NIGHTBATCH_<FIELD> (`Annotated[int, Env("X")]`)."""

    def __init__(self, name: str) -> None:
        self.name = name  # the setting name: the variable without its prefix, lower-cased


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


def env_var(name: str) -> str:
    """The environment variable a setting (or a job input) of that name is read from."""
    return ENV_PREFIX + name.upper()


class JsonSetting(Generic[T]):
    """A setting whose variable holds JSON (the stack writes it so): the field keeps the raw string, so the
    variable and assignment work as for any setting, and the section's typed accessor reads `parse(raw)`.

    Parsed and validated once per distinct raw value: the cache is keyed on the string, so a value assigned
    after construction (tests change a running stack's settings) is parsed on its first read. `validator`
    refuses a bad value when the settings are built, naming the variable; `empty` is what an unset one means.
    """

    def __init__(self, name: str, shape: Any, *, empty: str = "{}") -> None:
        self.env = env_var(name)
        self._adapter: TypeAdapter[T] = TypeAdapter(shape)
        self._empty = empty
        self.parse: Callable[[str], T] = lru_cache(maxsize=16)(self._parse)
        self.validator = AfterValidator(self._check)

    def _parse(self, raw: str) -> T:
        try:
            return self._adapter.validate_json(raw if raw.strip() else self._empty)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{self.env} is not valid: {first['msg']}" + (f" (at {where})" if where else "")
                             ) from None

    def _check(self, raw: str) -> str:
        self.parse(raw)
        return raw


@lru_cache(maxsize=64)
def comma_list(raw: str) -> tuple[str, ...]:
    """A comma-separated setting (NIGHTBATCH_EMAIL_ALLOWED_DOMAINS, NIGHTBATCH_USER_INPUT_BUCKETS, ...) as its
    entries, each stripped, empty ones dropped: parsed once per distinct value. The field keeps the raw string,
    as the stack writes it; the rule that reads the entries owns what they mean (tenancy/scope.py: allow_list,
    validation/media.py: allowed_domains, batches/recipients.py)."""
    return tuple(x for x in (part.strip() for part in raw.split(",")) if x)
