"""Serving: an OpenAI-compatible HTTP server on the engine, and a client-side benchmark.

    python -m course_lib.serve                 # the server (see __main__.py for the options)
    python -m course_lib.serve.bench --base-url http://127.0.0.1:8000 --concurrency 4 --num-requests 32

In Python: `create_app(llm, config=ServeConfig(...))` (app.py) is the FastAPI app; `ServeConfig` (guards.py)
holds its key, allowed hosts and limits; `BackgroundServer` runs it in a thread.
"""
from .app import create_app
from .background import SERVER_PROCESS_OPTIONS, BackgroundServer, free_port, stop_gracefully, wait_until_healthy
from .guards import ServeConfig

__all__ = ["create_app", "BackgroundServer", "ServeConfig", "free_port", "wait_until_healthy", "stop_gracefully",
           "SERVER_PROCESS_OPTIONS"]
