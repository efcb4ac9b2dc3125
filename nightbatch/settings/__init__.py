"""Settings: every environment variable the code reads, validated into pydantic models when a `Settings` is built,
grouped in sections by what reads them (one module per family of sections: service, pipeline, delivery).
`get_settings()` builds a process's settings from its environment once (the Lambdas, the worker); the CLI and the
local stack build their own (`from_names`, `updated`). A variable that holds JSON or a comma-separated list keeps
its raw string in the field; its typed reading is parsed where it is read, cached per distinct value
(settings/base.py: JsonSetting, comma_list), so a value changed on running settings is read afresh."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from nightbatch.settings.admission import AdmissionSettings
from nightbatch.settings.base import ENV_PREFIX, Env, Section, env_var
from nightbatch.settings.delivery import LinkSettings, NotificationSettings
from nightbatch.settings.pipeline import (
    DEFAULT_JOB_PREFIX,
    JOB_PREFIX_RE,
    AccountingSettings,
    CapacitySettings,
    GpuBackend,
    LimitSettings,
    PipelineSettings,
    SageMakerConfig,
    TenantLimits,
    ValidationSettings,
    WorkerSettings,
)
from nightbatch.settings.service import (
    ApiSettings,
    CliSettings,
    DeploymentSettings,
    FileSettings,
    ServingSettings,
    UploadSettings,
)

__all__ = [
    "DEFAULT_JOB_PREFIX", "ENV_PREFIX", "JOB_PREFIX_RE", "SETTINGS", "AccountingSettings", "AdmissionSettings",
    "ApiSettings",
    "CapacitySettings", "CliSettings", "DeploymentSettings", "Env", "FileSettings", "GpuBackend", "JobInputs",
    "LimitSettings", "LinkSettings", "NotificationSettings", "PipelineSettings", "SageMakerConfig", "Section",
    "ServingSettings", "SettingField", "Settings", "TenantLimits", "UploadSettings", "ValidationSettings",
    "WorkerSettings", "env_var", "get_settings", "nest", "variable_of",
]


@dataclass(frozen=True)
class SettingField:
    """One setting: its name (its environment variable without the prefix, lower-cased), section and field."""

    name: str
    section: str
    field: str

    @property
    def env(self) -> str:
        return env_var(self.name)

    @property
    def info(self) -> FieldInfo:
        section: type[BaseModel] = Settings.model_fields[self.section].annotation  # type: ignore[assignment]
        return section.model_fields[self.field]

    def get(self, settings: Settings) -> Any:
        return getattr(getattr(settings, self.section), self.field)

    def set(self, settings: Settings, value: Any) -> None:
        """In place (tests change a running stack's settings this way; its services read them per request)."""
        setattr(getattr(settings, self.section), self.field, value)


class Settings(BaseSettings):
    """Runtime configuration of the API, the task functions, the worker, the CLI and the local stack, in sections.

    Every field is read from its own environment variable, NIGHTBATCH_<NAME>: the names users set did not
    change when the settings were grouped (`Env` marks the fields named differently from their variable).
    A shard's per-job inputs are not here: they are `JobInputs`.
    """

    model_config = SettingsConfigDict(extra="forbid")

    deployment: DeploymentSettings = Field(default_factory=DeploymentSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    files: FileSettings = Field(default_factory=FileSettings)
    uploads: UploadSettings = Field(default_factory=UploadSettings)
    validation: ValidationSettings = Field(default_factory=ValidationSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    capacity: CapacitySettings = Field(default_factory=CapacitySettings)
    accounting: AccountingSettings = Field(default_factory=AccountingSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    links: LinkSettings = Field(default_factory=LinkSettings)
    notifications: NotificationSettings = Field(default_factory=NotificationSettings)
    cli: CliSettings = Field(default_factory=CliSettings)

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Arguments win over the environment, merged section by section.
        return init_settings, _Environment(settings_cls)

    @classmethod
    def from_names(cls, values: Mapping[str, Any]) -> Settings:
        """The environment's settings with some given by setting name ({"bucket": …, "worker_engine": …})."""
        nested: dict[str, Any] = nest(values)
        return cls(**nested)

    def updated(self, values: Mapping[str, Any]) -> Settings:
        """A copy with some settings changed, by setting name; validated, without reading the environment again."""
        data = self.model_dump()
        for section, fields in nest(values).items():
            data[section].update(fields)
        return type(self).model_validate(data)


def _fields() -> dict[str, SettingField]:
    found: dict[str, SettingField] = {}
    for section, info in Settings.model_fields.items():
        model = info.annotation
        assert isinstance(model, type) and issubclass(model, Section), section
        for field, finfo in model.model_fields.items():
            name = next((m.name for m in finfo.metadata if isinstance(m, Env)), field)
            if name in found:
                raise TypeError(f"setting {name!r} is in two sections: {found[name].section} and {section}")
            found[name] = SettingField(name=name, section=section, field=field)
    return found


# Every setting by name, in declaration order: the names environment variables and cdk.json `limits` use.
SETTINGS: dict[str, SettingField] = _fields()


def nest(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{"bucket": …, "worker_engine": …} -> {"deployment": {"bucket": …}, "worker": {"engine": …}}."""
    unknown = sorted(set(values) - set(SETTINGS))
    if unknown:
        raise KeyError(f"{unknown} are not settings (nightbatch/settings/)")
    nested: dict[str, dict[str, Any]] = {}
    for name, value in values.items():
        s = SETTINGS[name]
        nested.setdefault(s.section, {})[s.field] = value
    return nested


def variable_of(loc: tuple[int | str, ...]) -> str:
    """The variable behind an error location: ("worker", "poll_seconds") -> NIGHTBATCH_WORKER_POLL_SECONDS."""
    found = next((s for s in SETTINGS.values() if (s.section, s.field) == tuple(loc[:2])), None)
    return found.env if found else ENV_PREFIX + "*"


class _Environment(PydanticBaseSettingsSource):
    """NIGHTBATCH_<NAME> of every setting, into its section; names are case-insensitive, as pydantic-settings'."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ reads every setting at once

    def __call__(self) -> dict[str, Any]:
        env = {k.upper(): v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
        return nest({s.name: env[s.env] for s in SETTINGS.values() if s.env in env})


class JobInputs(BaseSettings):
    """What one GPU worker job is asked to run: its shard, set per job by AWS Batch or SageMaker.

    The state machine passes them as container overrides (infra/orchestration.py); the job definition's
    environment carries the deployment's settings.
    """

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    batch_id: str = ""
    shard_id: str = ""
    # SageMaker jobs: the deployment's settings do not fit its Environment (512 characters a value), so Plan
    # writes them to this object of the bucket (nightbatch/settings/document.py); empty on AWS Batch.
    settings_key: str = ""
    # "batch" or "sagemaker": where the job runs, recorded with its phase timings.
    backend: str = ""

    @classmethod
    def env_name(cls, field: str) -> str:
        if field not in cls.model_fields:
            raise KeyError(f"{field!r} is not a job input")
        return env_var(field)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
