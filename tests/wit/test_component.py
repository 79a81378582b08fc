"""The component host: wasi:nn@0.2.0-rc-2024-10-28 through real component guests on real llama.cpp."""

from __future__ import annotations

import gc
import json
import logging
import pathlib
import threading
import time

import pytest
import wasmtime
import wasmtime.component as cm

from wasinn_host import Limits, ModelRegistry, RunOptions, WasiNN
from wasinn_host.backend.local import LocalBackend
from wasinn_host.core.errors import ErrorKind
from wasinn_host.rpc.server import NNServer, ServeOptions
from wasinn_host.testing.gguf_models import successor_text, write_successor_model
from wasinn_host.testing.guest_runs import GUESTS
from wasinn_host.wit import ErrorCode, error_code_for

COMPONENTS = GUESTS / "components"


def run_component(
    nn: WasiNN, tmp_path: pathlib.Path, name: str, args: list[str], env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Run ``guest_examples/components/NAME.wasm`` through ``WasiNN.run``; exit code, stdout, stderr."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    code = nn.run(COMPONENTS / f"{name}.wasm", args, RunOptions(env=env or {}, stdout=str(out), stderr=str(err)))
    return code, out.read_text(), err.read_text()


def probe(nn: WasiNN, tmp_path: pathlib.Path, *commands: str) -> list[str]:
    """The result lines of ``nn_probe.wasm`` running ``commands``."""
    code, out, err = run_component(nn, tmp_path, "nn_probe", list(commands))
    assert code == 0, err
    return out.splitlines()


def metadata_of(line: str) -> dict[str, object]:
    """The JSON of a probe line ``metadata U8 [N] {...}``."""
    name, ty, dims, text = line.split(" ", 3)
    assert (name, ty) == ("metadata", "U8") and dims == f"[{len(text.encode())}]"
    result: dict[str, object] = json.loads(text)
    return result


def test_complete_component_prints_what_the_core_guest_prints(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    code, out, err = run_component(nn, tmp_path, "nn_complete", ["succ", "hello"])
    assert (code, out) == (0, successor_text("hello") + "</s>\n")
    meta = json.loads(err)
    assert (meta["input_tokens"], meta["output_tokens"], meta["stop_reason"]) == (6, 12, "eos")
    assert err.startswith('{"input_tokens": 6, "output_tokens": 12, "llama_build_number": ')  # WasmEdge's head
    core = nn.run(GUESTS / "complete.wasm", ["succ", "hello"], RunOptions(stdout=str(tmp_path / "core.out")))
    assert (core, (tmp_path / "core.out").read_text()) == (0, out)


def test_chat_component_resends_the_conversation_and_reuses_the_prefix(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    code, out, err = run_component(nn, tmp_path, "nn_chat", ["succ", "ab", "m", "Q"])
    assert code == 0, err
    assert out.splitlines() == [successor_text(p) + "</s>" for p in ("ab", "m", "Q")]
    first, second, third = (json.loads(line) for line in err.splitlines())
    # turn 1: <s> a b -> c..z </s>; turn 2 re-sends all of it plus "m": everything turn 1 decoded is reused
    assert (first["input_tokens"], first["output_tokens"]) == (3, 25)
    assert (second["input_tokens"], second["reused_tokens"]) == (29, 27)
    assert third["reused_tokens"] == second["input_tokens"] + second["output_tokens"] - 1


def test_every_function_through_the_probe(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    lines = probe(
        nn,
        tmp_path,
        *("tensor", "4", "-", "hello"),  # constructor, dimensions, ty, data
        *("tensor", "1", "2", "abcdefgh"),
        *("tensor", "6", "1", "12345678"),
        *("name", "succ", "ctx"),
        *("compute", "1", "prompt", "4", "-", "hello"),
        *("compute", "2", "q", "4", "1", "m", "metadata", "4", "-", '{"n-predict": 3}'),
        *("dropgraph", "compute", "1", "prompt", "4", "-", "xy", "dropctx"),  # a context outlives its graph handle
    )
    assert lines[:5] == [
        "tensor U8 [5] hello",
        "tensor FP32 [2] 8",
        "tensor I64 [1] 8",
        "graph ok",
        "ctx ok",
    ]
    assert lines[5:7] == ["outputs 2", f"output U8 [15] {successor_text('hello')}</s>"]
    assert metadata_of(lines[7])["output_tokens"] == 12
    assert lines[8:10] == ["outputs 2", f"output U8 [3] {successor_text('m', 3)}"]
    assert metadata_of(lines[10])["stop_reason"] == "n-predict"
    assert lines[11:13] == ["dropped", "outputs 2"]
    assert lines[13] == "output U8 [5] z</s>"
    assert metadata_of(lines[14])["stop_reason"] == "eos"
    assert lines[15:] == ["dropped"]


def test_hayride_options_tensor_gets_one_output_named_Output(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    options = json.dumps(
        {"temperature": 0, "num_context": 0, "num_batch": 0, "max_predict": 4, "top_k": 0, "top_p": 0.9, "seed": 0}
    )
    lines = probe(
        nn,
        tmp_path,
        *("name", "succ", "ctx"),
        # Hayride's guests name the prompt anything and send the options tensor; dims [1] as they do
        *("compute", "2", "user", "4", "1", "abc", "options", "4", "1", options),
        *("compute", "2", "options", "4", "-", "{}", "input", "4", "-", "k"),
    )
    assert lines == [
        "graph ok",
        "ctx ok",
        "outputs 1",
        f"Output U8 [4] {successor_text('abc', 4)}",
        "outputs 1",
        f"Output U8 [4] {successor_text('k', 4)}",  # settings stay on the context, as set_input metadata's do
    ]


def test_embedding_model_returns_an_fp32_vector(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    lines = probe(nn, tmp_path, "name", 'succ {"embedding": true}', "ctx", "compute", "1", "prompt", "4", "-", "a")
    assert lines[:4] == ["graph ok", "ctx ok", "outputs 2", "output FP32 [384] 1536"]
    assert metadata_of(lines[4])["output_tokens"] == 0


ERRORS = [
    # (commands, expected line) -- every line is "error CODE MESSAGE", MESSAGE = what the log says
    (("name", "nope"), "error not-found load-by-name: model name 'nope' is not preloaded; known names: "),
    (("name", "missing"), "error not-found load-by-name: model file "),
    (
        ("bytes", "0", "0", "00"),
        "error invalid-encoding load: encoding openvino is not supported; accepted: ggml, autodetect",
    ),
    (("bytes", "5", "0", "0011"), "error invalid-argument load: builders[0] is not a GGUF model"),
    (
        ("name", "succ", "ctx", "compute", "1", "x", "1", "-", "abc"),
        "error invalid-argument compute: no prompt: name the U8 prompt tensor 'prompt'",
    ),
    (
        ("name", "succ", "ctx", "compute", "2", "prompt", "4", "-", "a", "metadata", "4", "-", '{"temp": "hot"}'),
        "error invalid-argument compute: config key 'temp': got string \"hot\"; expected a number",
    ),
    (
        ("name", "succ", "ctx", "compute", "2", "prompt", "4", "-", "a", "metadata", "4", "-", "{"),
        "error invalid-encoding compute: config is not valid JSON",
    ),
    (
        ("name", "succ", "ctx", "compute", "1", "prompt", "4", "7", "abc"),
        "error invalid-argument compute: input 'prompt': dimensions [7] do not describe 3 bytes; use [1] or [3]",
    ),
    (
        ("name", "succ", "ctx", "compute", "2", "prompt", "4", "-", "a", "prompt", "4", "-", "b"),
        "error invalid-argument compute: two input tensors are named 'prompt'",
    ),
    (("name", "succ", "ctx", "big", "1048577"), "error too-large compute: prompt of 1048577 bytes"),
]


@pytest.mark.parametrize("commands,expected", ERRORS)
def test_error_codes_and_messages(
    nn: WasiNN, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, commands: tuple[str, ...], expected: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        line = probe(nn, tmp_path, *commands)[-1]
    assert line.startswith(expected)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("wasi:nn ")]
    code, data = line.split(" ", 2)[1:]
    assert logged[-1] == f"wasi:nn {data} ({code})"  # error.data() is the line the log got


def test_one_mib_prompt_tensor_crosses_and_is_refused_by_the_context(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    # 1 MiB is exactly max_prompt_bytes: the bytes reach the model, whose context is far smaller
    line = probe(nn, tmp_path, "name", "succ", "ctx", "big", str(1 << 20))[-1]
    assert line.startswith("error too-large compute: ") and "1048577 tokens" in line


def test_limits_and_allow_list(registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    nn = WasiNN(
        registry=registry,
        limits=Limits(max_contexts_per_store=1, allow_load_bytes=False),
        allowed_models=["succ"],
    )
    lines = probe(nn, tmp_path, "name", "noisy", "name", "succ", "ctx", "ctx", "bytes", "5", "0", "00")
    assert lines[0] == "error not-found load-by-name: model name 'noisy' is not allowed for this guest; allowed: succ"
    assert lines[1:3] == ["graph ok", "ctx ok"]
    assert lines[3].startswith("error runtime-error init-execution-context: ")  # busy has no WIT code
    assert "max_contexts_per_store" in lines[3]
    assert lines[4].startswith("error unsupported-operation load: loading models from guest bytes is disabled")
    small = WasiNN(registry=registry, limits=Limits(max_load_bytes=1))
    assert probe(small, tmp_path, "bytes", "5", "0", "0011")[0].startswith("error too-large load: model of 2 bytes")


def test_load_from_bytes(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    # F16 keeps the model under 2,796,202 bytes, the most wasmtime lets a guest pass in one list<u8>
    # ("fuel allocated for hostcalls has been exhausted", see the README and test_component_lists.py)
    model = write_successor_model(tmp_path / "small.gguf", f16=True).read_bytes().hex()
    lines = probe(nn, tmp_path, "bytes", "5", "0", model, "ctx", "compute", "1", "prompt", "4", "-", "m")
    text = successor_text("m") + "</s>"
    assert lines[:4] == ["graph ok", "ctx ok", "outputs 2", f"output U8 [{len(text)}] {text}"]


def test_every_error_kind_has_a_wit_code() -> None:
    assert {kind: error_code_for(kind) for kind in ErrorKind} == {
        ErrorKind.INVALID_ARGUMENT: ErrorCode.INVALID_ARGUMENT,
        ErrorKind.INVALID_ENCODING: ErrorCode.INVALID_ENCODING,
        ErrorKind.MISSING_MEMORY: ErrorCode.RUNTIME_ERROR,
        ErrorKind.BUSY: ErrorCode.RUNTIME_ERROR,
        ErrorKind.RUNTIME_ERROR: ErrorCode.RUNTIME_ERROR,
        ErrorKind.UNSUPPORTED: ErrorCode.UNSUPPORTED_OPERATION,
        ErrorKind.TOO_LARGE: ErrorCode.TOO_LARGE,
        ErrorKind.NOT_FOUND: ErrorCode.NOT_FOUND,
        ErrorKind.END_OF_SEQUENCE: ErrorCode.RUNTIME_ERROR,
        ErrorKind.CONTEXT_FULL: ErrorCode.TOO_LARGE,
        ErrorKind.PROMPT_TOO_LONG: ErrorCode.TOO_LARGE,
        ErrorKind.MODEL_NOT_FOUND: ErrorCode.NOT_FOUND,
        ErrorKind.SECURITY: ErrorCode.SECURITY,
        ErrorKind.TIMEOUT: ErrorCode.TIMEOUT,
    }
    assert {code.value for code in ErrorCode} == {
        "invalid-argument", "invalid-encoding", "timeout", "runtime-error", "unsupported-operation",
        "too-large", "not-found", "security", "unknown",
    }  # fmt: skip


def test_a_host_bug_is_error_code_unknown_not_a_trap(
    nn: WasiNN, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(name: str, config: object) -> None:
        raise KeyError("oops")

    monkeypatch.setattr(nn.backend, "load_by_name", broken)
    assert probe(nn, tmp_path, "name", "succ") == ["error unknown load-by-name: internal error: KeyError: 'oops'"]


def _instantiate_probe(nn: WasiNN, store: wasmtime.Store, args: list[str], out: pathlib.Path) -> None:
    linker = cm.Linker(nn.engine)
    linker.add_wasip2()
    nn.add_to_component_linker(linker)
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["nn_probe", *args]
    wasi.stdout_file = str(out)
    store.set_wasi(wasi)
    instance = linker.instantiate(store, cm.Component.from_file(nn.engine, str(COMPONENTS / "nn_probe.wasm")))
    interface = instance.get_export_index(store, "wasi:cli/run@0.2.0")
    index = instance.get_export_index(store, "run", interface)
    assert index is not None
    run = instance.get_func(store, index)
    assert run is not None
    assert run(store).tag == "ok"


def test_resources_left_by_the_guest_are_freed_with_the_store(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    store = wasmtime.Store(nn.engine)
    nn.attach(store)
    # keeps one graph and one context (with a computed conversation) and drops nothing
    _instantiate_probe(nn, store, ["name", "succ", "ctx", "compute", "1", "prompt", "4", "-", "ab"], tmp_path / "o")
    (state,) = nn.wit_imports.states()
    assert state.live() == {"tensor": 0, "graph": 1, "graph-execution-context": 1, "error": 0, "tensor-stream": 0}
    assert nn.imports.contexts_alive.value == 1
    context = next(iter(state.contexts.values()))
    del store
    gc.collect()
    assert nn.wit_imports.states() == []
    assert nn.imports.contexts_alive.value == 0
    assert context.closed is True  # type: ignore[attr-defined]  # the llama.cpp sequence went back to the model


def test_dropped_resources_are_freed_at_once(nn: WasiNN, tmp_path: pathlib.Path) -> None:
    store = wasmtime.Store(nn.engine)
    nn.attach(store)
    _instantiate_probe(
        nn,
        store,
        ["name", "succ", "ctx", "tensor", "4", "-", "x", "dropctx", "dropgraph", "name", "nope"],
        tmp_path / "o",
    )
    (state,) = nn.wit_imports.states()
    assert state.live() == {"tensor": 0, "graph": 0, "graph-execution-context": 0, "error": 0, "tensor-stream": 0}
    assert nn.imports.contexts_alive.value == 0
    nn.detach(store)


def test_component_and_core_module_at_once_decode_in_one_batch(
    successor_path: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    registry = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
    nn = WasiNN(registry=registry)
    results: dict[str, tuple[int, str]] = {}

    def core_running() -> bool:
        models = nn.status()["models"]
        return bool(models) and models[0]["running"] == 1

    def component() -> None:
        deadline = time.monotonic() + 60
        while not core_running():  # start while the core module is generating
            assert time.monotonic() < deadline, "the core module never started generating"
            time.sleep(0.001)
        lines = probe(nn, tmp_path, "name", "succ", "ctx", "compute", "2", "prompt", "4", "-", "5",
                      "metadata", "4", "-", '{"n-predict": 100}')  # fmt: skip
        results["component"] = (0, lines[3])

    def core() -> None:
        out = tmp_path / "core.out"
        options = RunOptions(env={"n_predict": "480"}, stdout=str(out), stderr=str(tmp_path / "core.err"))
        results["core"] = (nn.run(GUESTS / "complete.wasm", ["succ", "0"], options), out.read_text())

    threads = [threading.Thread(target=component), threading.Thread(target=core)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert results == {
        "component": (0, f"output U8 [100] {successor_text('5', 100)}"),
        "core": (0, successor_text("0", 480) + "\n"),
    }
    (model,) = nn.status()["models"]
    assert model["sequences_high_water"] == 2
    # the component's 100 tokens were decoded in the core module's steps (a few steps of slack)
    assert model["decode_calls"] <= model["decoded_tokens"] - 95
    nn.close()
    registry.close()


def test_idle_contexts_are_freed(registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    nn = WasiNN(registry=registry, limits=Limits(idle_timeout_ms=50))
    store = wasmtime.Store(nn.engine)
    nn.attach(store)
    _instantiate_probe(nn, store, ["name", "succ", "ctx", "compute", "1", "prompt", "4", "-", "ab"], tmp_path / "o")
    (state,) = nn.wit_imports.states()
    deadline = time.monotonic() + 30
    while state.contexts and time.monotonic() < deadline:
        time.sleep(0.01)
    assert state.live() == {"tensor": 0, "graph": 1, "graph-execution-context": 0, "error": 0, "tensor-stream": 0}
    assert nn.imports.contexts_alive.value == 0
    nn.detach(store)


def test_components_over_rpc(registry: ModelRegistry, tmp_path: pathlib.Path) -> None:
    server = NNServer(f"unix:{tmp_path / 'nn.sock'}", LocalBackend(registry, Limits()), options=ServeOptions())
    server.start()
    remote = WasiNN(rpc=f"unix://{server.address.unix_path}")
    try:
        code, out, err = run_component(remote, tmp_path, "nn_chat", ["succ", "ab", "m"])
        assert (code, out) == (0, f"{successor_text('ab')}</s>\n{successor_text('m')}</s>\n")
        assert json.loads(err.splitlines()[1])["reused_tokens"] == 27  # the server kept the conversation's KV
        lines = probe(remote, tmp_path, "name", "nope", "name", "succ", "ctx", "compute", "2", "q", "4", "-", "m",
                      "options", "4", "-", '{"max_predict": 3}')  # fmt: skip
        assert lines[0].startswith("error not-found load-by-name: model name 'nope' is not preloaded")
        assert lines[1:] == ["graph ok", "ctx ok", "outputs 1", f"Output U8 [3] {successor_text('m', 3)}"]
        streamed = run_component(remote, tmp_path, "hayride_stream", ["succ", "k", '{"max_predict": 4}'])
        assert streamed == (0, successor_text("k", 4) + "\n", "stream Output, chunks: 4\n"), "Hayride's streams too"
    finally:
        remote.close()
        server.stop(1)
