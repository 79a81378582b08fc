"""The served examples of ``examples/serving``: an ASGI app running a wasm guest per request and one using
asyncio sessions, both streaming server-sent events.  Tested with httpx against the apps in process and
against a real uvicorn server process on loopback: concurrent streams all answered right, a client that
disconnects mid-stream frees its sequence, the server's RSS flat over 1,000 requests."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import httpx
import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.testing.gguf_models import successor_text
from wasinn_host.testing.guest_runs import GUESTS

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "serving"
WAIT = 120.0
PROMPTS = ("abc", "hello", "u", "xy", "mnop", "b", "qrs", "jk")


def load_example(name: str, monkeypatch: pytest.MonkeyPatch, preload: str) -> ModuleType:
    """Import ``examples/serving/NAME.py`` (its module-level app configured by the environment)."""
    monkeypatch.setenv("WASINN_PRELOAD", preload)
    spec = importlib.util.spec_from_file_location(f"serving_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def events(body: str) -> list[tuple[str, Any]]:
    """The (event, data) pairs of a text/event-stream body (event "message" when unnamed)."""
    out = []
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((fields.get("event", "message"), json.loads(fields["data"])))
    return out


def streamed_text(body: str) -> tuple[str, list[tuple[str, Any]]]:
    """The joined ``message`` data of an SSE body, and its other events."""
    pairs = events(body)
    return "".join(data for event, data in pairs if event == "message"), [p for p in pairs if p[0] != "message"]


@pytest.fixture
def own_nn(model_dir: pathlib.Path) -> Iterator[WasiNN]:
    nn = WasiNN(registry=ModelRegistry([f"default:GGML:AUTO:{model_dir / 'successor.gguf'}"]), interruptible=True)
    yield nn
    nn.close()


# -- in process ------------------------------------------------------------------------------------


def test_guest_app_in_process_streams_each_guests_answer(
    own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch, preload_specs: list[str]
) -> None:
    """guest_sse's app through httpx's ASGI transport: eight requests at once, each a chat.wasm run whose
    streamed stdout is its answer and a newline, then an ``end`` event with exit code 0; an empty prompt
    is a 400."""
    module = load_example("guest_sse", monkeypatch, preload_specs[0])
    app = module.create_app(own_nn, GUESTS / "chat.wasm", "default")

    async def main() -> tuple[list[httpx.Response], httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app", timeout=WAIT) as client:
            answers = await asyncio.gather(*(client.post("/v1/stream", content=p.encode()) for p in PROMPTS))
            empty = await client.post("/v1/stream", content=b"")
        return list(answers), empty

    answers, empty = asyncio.run(main())
    for prompt, response in zip(PROMPTS, answers):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert streamed_text(response.text) == (successor_text(prompt) + "\n", [("end", 0)])
    assert empty.status_code == 400


def test_session_app_in_process_streams_and_completes(
    own_nn: WasiNN, monkeypatch: pytest.MonkeyPatch, preload_specs: list[str]
) -> None:
    """session_sse's app through httpx's ASGI transport: eight streams at once, each its answer (without
    the end-of-generation piece) and an ``end`` event with the usage; /v1/complete answers JSON."""
    module = load_example("session_sse", monkeypatch, preload_specs[0])
    app = module.create_app(own_nn, "default")

    async def main() -> tuple[list[httpx.Response], httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app", timeout=WAIT) as client:
            streams = await asyncio.gather(*(client.post("/v1/stream", content=p.encode()) for p in PROMPTS))
            complete = await client.post("/v1/complete", content=b"abc")
        return list(streams), complete

    streams, complete = asyncio.run(main())
    for prompt, response in zip(PROMPTS, streams):
        text, others = streamed_text(response.text)
        assert text == successor_text(prompt)
        assert [event for event, _ in others] == ["end"]
        assert others[0][1]["output_tokens"] == len(successor_text(prompt)) + 1  # the letters and </s>
    assert complete.json() == {"text": successor_text("abc") + "</s>"}


# -- a real server process -------------------------------------------------------------------------


class Server:
    """``uvicorn MODULE:app`` from examples/serving on a free loopback port."""

    def __init__(self, module: str, env: dict[str, str]) -> None:
        command = [sys.executable, "-m", "uvicorn", f"{module}:app", "--app-dir", str(EXAMPLES)]
        command += ["--host", "127.0.0.1", "--port", "0", "--log-level", "info"]
        full_env = {**os.environ, **env, "PYTHONPATH": str(EXAMPLES.parents[1])}
        self.proc = subprocess.Popen(command, env=full_env, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + WAIT
        self.log: list[str] = []
        while True:
            line = self.proc.stderr.readline()
            assert line and time.monotonic() < deadline, "uvicorn did not start:\n" + "".join(self.log)
            self.log.append(line)
            found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.url = f"http://127.0.0.1:{found.group(1)}"
                break

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status", encoding="ascii") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

    def status(self) -> dict[str, Any]:
        return httpx.get(self.url + "/status", timeout=WAIT).json()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def server_env(preload_specs: list[str]) -> dict[str, str]:
    return {"WASINN_PRELOAD": preload_specs[0]}


async def stream_all(url: str, prompts: list[str]) -> list[tuple[int, str]]:
    """POST every prompt to ``url`` at once, reading each response as a stream: (status, body)."""
    limits = httpx.Limits(max_connections=len(prompts))
    async with httpx.AsyncClient(timeout=WAIT, limits=limits) as client:

        async def one(prompt: str) -> tuple[int, str]:
            async with client.stream("POST", url, content=prompt.encode()) as response:
                body = b"".join([chunk async for chunk in response.aiter_bytes()])
                return response.status_code, body.decode()

        return list(await asyncio.gather(*(one(p) for p in prompts)))


@pytest.mark.parametrize("module", ["guest_sse", "session_sse"])
def test_uvicorn_answers_64_concurrent_streams(module: str, server_env: dict[str, str]) -> None:
    """64 concurrent streaming requests to the example under uvicorn on loopback: every one answered
    right (a guest per request, or a session per request)."""
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(64)]
    server = Server(module, server_env)
    try:
        answers = asyncio.run(stream_all(server.url + "/v1/stream", prompts))
        status = server.status()
    finally:
        server.stop()
    for prompt, (code, body) in zip(prompts, answers):
        assert code == 200
        text, others = streamed_text(body)
        if module == "guest_sse":
            assert (text, others) == (successor_text(prompt) + "\n", [("end", 0)])
        else:
            assert text == successor_text(prompt) and others[0][0] == "end"
    assert status["performance"]["requests"] >= 64  # more when a stream's client fell behind (its job paused)
    assert status["models"][0]["sequences_in_use"] == 0


def test_a_client_that_disconnects_mid_stream_frees_its_sequence(server_env: dict[str, str]) -> None:
    """A stream of up to 3,000 tokens (end of generation ignored) whose client reads one event and closes
    the connection: the server ends the sequence (no sequence in use) long before the 3,000 tokens."""
    env = {**server_env, "WASINN_CONFIG": '{"ignore-eos": true, "n-predict": 3000}'}
    server = Server("session_sse", env)
    try:
        with httpx.Client(timeout=WAIT) as client:
            with client.stream("POST", server.url + "/v1/stream", content=b"a") as response:
                first = next(response.iter_raw())
            assert first == b'data: "b"\n\n'
            deadline = time.monotonic() + WAIT
            while (status := server.status())["models"][0]["sequences_in_use"] != 0:
                assert time.monotonic() < deadline, "the sequence was not freed"
                time.sleep(0.05)
            generated = status["performance"]["generated_tokens"]
            time.sleep(0.2)  # nothing more is generated for it
            assert server.status()["performance"]["generated_tokens"] == generated
    finally:
        server.stop()
    assert generated < 3000


def test_the_server_rss_stays_flat_over_1000_requests(server_env: dict[str, str]) -> None:
    """1,000 streamed requests (16 at a time) to session_sse under uvicorn: after the first 200, the other
    800 add under 8 MiB of RSS (nothing kept per request: sessions, contexts and queues are freed)."""
    server = Server("session_sse", server_env)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    try:

        async def rounds(n: int) -> None:
            for _ in range(n):
                for code, body in await stream_all(server.url + "/v1/stream", prompts):
                    assert code == 200 and streamed_text(body)[1][0][0] == "end"

        asyncio.run(rounds(13))  # 208 requests
        warm = server.rss()
        asyncio.run(rounds(50))  # 800 more
        end = server.rss()
        requests = server.status()["performance"]["requests"]
    finally:
        server.stop()
    assert requests >= 63 * 16  # a stream whose client fell 16 tokens behind goes on in a job of its own
    assert end - warm < 8 << 20, f"RSS grew {(end - warm) / 2**20:.1f} MiB over 800 requests"
