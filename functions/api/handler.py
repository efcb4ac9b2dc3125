"""API Lambda entry point."""

from mangum import Mangum

from functions.api.app import create_app
from nightbatch.logs import configure_logging

configure_logging()

app = create_app()
handler = Mangum(app, lifespan="off")
