"""The local stack: embedded AWS (moto), the same API app, the same tasks and worker, real CPU engines."""
