"""An ASGI app that runs a wasm guest per request and streams its tokens as server-sent events.

Each ``POST /v1/stream`` (the body is the prompt) runs ``chat.wasm`` (from ``guest_examples/``), a
WASI-NN guest that streams its answer with ``compute_single``, with the prompt on its stdin; every
chunk the guest writes to its stdout is sent at once as an SSE ``data:`` event (a JSON string), and an
``end`` event carries its exit code.  Guests run on ``WasiNN.run_async``'s pool of threads; the
model's worker batches the computes of all the guests running at once.  A client that disconnects
cancels its guest: it is interrupted and its sequence freed at the model's next step.

Run it (any ASGI server; uvicorn here)::

    pip install wasinn-host starlette uvicorn
    WASINN_PRELOAD=default:GGML:AUTO:model.gguf uvicorn guest_sse:app --app-dir examples/serving
    curl -N -d 'What is 2+2?' http://127.0.0.1:8000/v1/stream

Settings (environment): ``WASINN_PRELOAD`` (an ``--nn-preload`` spec; default: the embedded demo
model as ``default``), ``WASINN_GUEST`` (the guest; default ``guest_examples/chat.wasm``),
``WASINN_GUEST_ENV`` (JSON object of the guest's environment, e.g. ``{"n_predict": "64"}``),
``WASINN_GUEST_THREADS`` (guests running at once, default 64).  ``GET /status`` is the host's status.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import pathlib
from collections.abc import AsyncIterator, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from wasinn_host import GuestError, Preload, RunOptions, WasiNN
from wasinn_host.models import DEMO_MODEL_PATH

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUEUED_CHUNKS = 64
"""Output chunks of one guest that may wait for its client before the guest waits (back-pressure)."""


def sse(data: object, event: str | None = None) -> bytes:
    """One server-sent event whose data is ``data`` as JSON."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def create_app(
    nn: WasiNN, guest: str | os.PathLike[str], name: str = "default", env: Mapping[str, str] | None = None
) -> Starlette:
    """The app: ``POST /v1/stream`` runs ``guest`` (argument ``name``, the prompt on its stdin) per request."""
    compiled = nn.load_guest(guest)  # compiled once, instantiated per request

    async def stream(request: Request) -> Response:
        prompt = (await request.body()).decode("utf-8", "replace").replace("\n", " ").strip()
        if not prompt:
            return JSONResponse({"error": "the body is the prompt; it is empty"}, status_code=400)
        return StreamingResponse(run_guest(prompt), media_type="text/event-stream")

    async def run_guest(prompt: str) -> AsyncIterator[bytes]:
        chunks: asyncio.Queue[bytes | tuple[str, object]] = asyncio.Queue(QUEUED_CHUNKS)
        read_end, write_end = os.pipe()  # the guest's stdin: the prompt line, then end of file
        os.write(write_end, prompt.encode() + b"\n")
        os.close(write_end)
        options = RunOptions(env=env or {}, stdin=f"/dev/fd/{read_end}", close_fds=(read_end,))

        async def run() -> None:
            try:
                code = await nn.run_async(compiled, [name], options, stdout=chunks.put, stderr=bytearray())
                await chunks.put(("end", code))
            except GuestError as exc:
                await chunks.put(("error", str(exc)))

        task = asyncio.ensure_future(run())
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        try:
            while True:
                item = await chunks.get()
                if isinstance(item, tuple):
                    rest = decoder.decode(b"", final=True)
                    if rest:
                        yield sse(rest)
                    yield sse(item[1], item[0])
                    return
                text = decoder.decode(item)
                if text:
                    yield sse(text)
        finally:
            if not task.done():  # the client went away: stop its guest (and free its sequence)
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def status(_: Request) -> Response:
        return JSONResponse(nn.status())

    return Starlette(routes=[Route("/v1/stream", stream, methods=["POST"]), Route("/status", status)])


def app_from_environment() -> Starlette:
    """The app as the environment variables above configure it."""
    spec = os.environ.get("WASINN_PRELOAD")
    preload = [spec] if spec else [Preload("default", DEMO_MODEL_PATH)]
    name = spec.split(":", 1)[0] if spec else "default"
    threads = int(os.environ.get("WASINN_GUEST_THREADS", "64"))
    nn = WasiNN(preload=preload, interruptible=True, guest_threads=threads)
    guest = os.environ.get("WASINN_GUEST", str(ROOT / "guest_examples" / "chat.wasm"))
    env = json.loads(os.environ.get("WASINN_GUEST_ENV", "{}"))
    return create_app(nn, guest, name, env)


app = app_from_environment()
