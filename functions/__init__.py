"""Lambda entry points: the API (FastAPI + Mangum) and one handler per workflow step."""
