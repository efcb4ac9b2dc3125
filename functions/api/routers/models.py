"""/v1/models: the models this deployment serves, from configuration."""

from __future__ import annotations

from fastapi import APIRouter

from functions.api.deps import PrincipalDep, ServicesDep
from nightbatch.errors import NotFoundError
from nightbatch.models.spec import ModelSpec, served_model
from nightbatch.wire import ListPage, Model

router = APIRouter(prefix="/v1/models", tags=["models"])
CREATED = 1_735_689_600  # a fixed date: served models have no creation time of their own


@router.get("", response_model=ListPage[Model])
def list_models(_: PrincipalDep, services: ServicesDep) -> ListPage[Model]:
    data = [m for spec in services.settings.serving.models for m in _models(spec)]
    return ListPage(data=data, first_id=data[0].id if data else None,
                    last_id=data[-1].id if data else None, has_more=False)


@router.get("/{model_id:path}", response_model=Model)
def retrieve_model(model_id: str, _: PrincipalDep, services: ServicesDep) -> Model:
    spec = served_model(services.settings.serving.models, model_id)
    if spec is None:
        raise NotFoundError(f"The model '{model_id}' does not exist.", param="model", code="model_not_found")
    return next(m for m in _models(spec) if m.id == model_id)


def _models(spec: ModelSpec) -> list[Model]:
    """A served model, then its LoRA adapters; as vLLM lists them, an adapter's `parent` and `root` name the
    model it runs on (under `nightbatch`: OpenAI's Model has no such fields)."""
    info = {"task": spec.task, "endpoints": list(spec.endpoints)}
    return [Model(id=spec.name, created=CREATED, nightbatch=info),
            *(Model(id=name, created=CREATED, nightbatch={**info, "parent": spec.name, "root": spec.name})
              for name in spec.lora_modules)]
