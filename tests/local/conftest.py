"""The pipeline's in-process world (tests/support/pipeline_world.py): its `services` fixture, on moto."""

from tests.support.pipeline_world import services  # noqa: F401
