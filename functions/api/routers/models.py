"""/v1/models: the models this deployment serves, from configuration."""

from __future__ import annotations

from fastapi import APIRouter

from functions.api.deps import PrincipalDep, ServicesDep
from nightbatch.errors import NotFoundError
from nightbatch.model_spec import ModelSpec
from nightbatch.wire import ListPage, Model

router = APIRouter(prefix="/v1/models", tags=["models"])
CREATED = 1_735_689_600  # a fixed date: served models have no creation time of their own


@router.get("", response_model=ListPage[Model])
def list_models(_: PrincipalDep, services: ServicesDep) -> ListPage[Model]:
    data = [_model(m) for m in services.settings.serving.models]
    return ListPage(data=data, first_id=data[0].id if data else None,
                    last_id=data[-1].id if data else None, has_more=False)


@router.get("/{model_id:path}", response_model=Model)
def retrieve_model(model_id: str, _: PrincipalDep, services: ServicesDep) -> Model:
    spec = services.settings.serving.model(model_id)
    if spec is None:
        raise NotFoundError(f"The model '{model_id}' does not exist.", param="model", code="model_not_found")
    return _model(spec)


def _model(spec: ModelSpec) -> Model:
    return Model(id=spec.name, created=CREATED, nightbatch={"task": spec.task, "endpoints": list(spec.endpoints)})
