"""API Lambda entry point."""

from mangum import Mangum

from functions.api.app import create_app

app = create_app()
handler = Mangum(app, lifespan="off")
