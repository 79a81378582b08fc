"""An ASGI app that serves a model through asyncio sessions, without a guest: SSE streaming and JSON.

``POST /v1/stream`` (the body is the prompt) streams the answer as server-sent events, one ``data:``
event (a JSON string) per piece of text, then an ``end`` event with the usage figures;
``POST /v1/complete`` answers ``{"text": ...}``.  Each request opens its own session (an execution
context) with ``nn.session_async``; no thread waits for the model: the model's worker completes each
request's future on the event loop and batches the requests running at once.  A client that
disconnects ends its sequence at the model's next step; a slow client stalls only its own stream.

Run it::

    pip install wasinn-host starlette uvicorn
    WASINN_PRELOAD=default:GGML:AUTO:model.gguf uvicorn session_sse:app --app-dir examples/serving
    curl -N -d 'Once upon a time' http://127.0.0.1:8000/v1/stream

Settings (environment): ``WASINN_PRELOAD`` (an ``--nn-preload`` spec; default: the embedded demo
model as ``default``), ``WASINN_CONFIG`` (the sessions' config JSON, e.g. ``{"n-predict": 64}``).
``GET /status`` is the host's status.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from wasinn_host import Preload, WasiNN, WasiNNError
from wasinn_host.models import DEMO_MODEL_PATH


def sse(data: object, event: str | None = None) -> bytes:
    """One server-sent event whose data is ``data`` as JSON."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def create_app(nn: WasiNN, name: str = "default", config: Mapping[str, Any] | None = None) -> Starlette:
    """The app: sessions on the preloaded ``name`` with ``config``."""

    async def prompt_of(request: Request) -> str:
        return (await request.body()).decode("utf-8", "replace")

    async def stream(request: Request) -> Response:
        prompt = await prompt_of(request)
        if not prompt:
            return JSONResponse({"error": "the body is the prompt; it is empty"}, status_code=400)
        return StreamingResponse(pieces(prompt), media_type="text/event-stream")

    async def pieces(prompt: str) -> AsyncIterator[bytes]:
        async with nn.session_async(name, config) as session:
            try:
                async for piece in session.stream(prompt):
                    yield sse(piece.decode("utf-8", "replace"))
            except WasiNNError as exc:
                yield sse(exc.message, "error")
                return
            yield sse(session.metadata, "end")

    async def complete(request: Request) -> Response:
        prompt = await prompt_of(request)
        async with nn.session_async(name, config) as session:
            try:
                return JSONResponse({"text": await session.complete(prompt)})
            except WasiNNError as exc:
                return JSONResponse({"error": exc.message}, status_code=500)

    async def status(_: Request) -> Response:
        return JSONResponse(nn.status())

    return Starlette(
        routes=[
            Route("/v1/stream", stream, methods=["POST"]),
            Route("/v1/complete", complete, methods=["POST"]),
            Route("/status", status),
        ]
    )


def app_from_environment() -> Starlette:
    """The app as the environment variables above configure it."""
    spec = os.environ.get("WASINN_PRELOAD")
    preload = [spec] if spec else [Preload("default", DEMO_MODEL_PATH)]
    name = spec.split(":", 1)[0] if spec else "default"
    config = json.loads(os.environ.get("WASINN_CONFIG", "{}"))
    return create_app(WasiNN(preload=preload), name, config)


app = app_from_environment()
