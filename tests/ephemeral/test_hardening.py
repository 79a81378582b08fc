"""Hostile guests, faults and limits: each refusal is the right errno and one log line."""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import struct
import threading
import time

import pytest
import wasmtime

from wasinn_host import Errno, Limits, ModelRegistry, WasiNN
from wasinn_host.testing.abi_guest import AbiGuest, streaming_guest_wat
from wasinn_host.testing.gguf_models import successor_text


def one_line(caplog: pytest.LogCaptureFixture, *needles: str) -> str:
    lines = [r.getMessage() for r in caplog.records if r.name == "wasinn_host" and r.levelname == "WARNING"]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("damage", ["truncated", "zeroed-tensors-header", "not-gguf", "empty"])
def test_broken_model_files_are_refused_and_the_host_goes_on(
    damage: str, tmp_path: pathlib.Path, successor_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = successor_path.read_bytes()
    broken = tmp_path / f"{damage}.gguf"
    broken.write_bytes(
        {
            "truncated": data[: len(data) // 3],
            "zeroed-tensors-header": data[:8] + b"\xff" * 16 + data[24:],
            "not-gguf": b"PK\x03\x04 this is a zip file, not a model" * 10,
            "empty": b"",
        }[damage]
    )
    registry = ModelRegistry([f"bad:GGML:AUTO:{broken}", f"good:GGML:AUTO:{successor_path}"])
    nn = WasiNN(registry=registry)
    guest = AbiGuest.create(nn)
    with caplog.at_level("WARNING", logger="wasinn_host"):
        assert guest.load_by_name("bad")[0] == Errno.INVALID_ARGUMENT
    line = one_line(caplog, str(broken))
    # llama.cpp's refusal; with a GPU the host reads the header first, to size the layers it offloads
    assert "could not load model file" in line or "cannot read the GGUF header" in line, line
    graph = guest.load_by_name("good")[1]
    assert guest.generate(graph, "w") == (0, "xyz</s>")
    registry.close()


def test_model_file_removed_after_preload(tmp_path: pathlib.Path, successor_path: pathlib.Path) -> None:
    copy = tmp_path / "soon-gone.gguf"
    shutil.copy(successor_path, copy)
    registry = ModelRegistry([f"gone:GGML:AUTO:{copy}"])
    copy.unlink()
    guest = AbiGuest.create(WasiNN(registry=registry))
    assert guest.load_by_name("gone")[0] == Errno.MODEL_NOT_FOUND
    registry.close()


def test_guest_bytes_duplicate_token_model_does_not_abort(nn: WasiNN, successor_path: pathlib.Path) -> None:
    model = bytearray(successor_path.read_bytes())
    one = struct.pack("<Q", 1)
    at = model.index(one + b"a" + one + b"b")
    model[at + 17] = ord("a")  # vocabulary "b" -> "a": llama.cpp aborts on duplicate token strings
    guest = AbiGuest.create(nn, memory_pages=80)
    guest.write(0x10000, bytes(model))
    guest.write(0x100, struct.pack("<2I", 0x10000, len(model)))
    assert guest.call("load", 0x100, 1, 6, 0, 0x40) == Errno.INVALID_ARGUMENT
    assert guest.call("load", 0x100, 1, 6, 0, 0x40) == Errno.INVALID_ARGUMENT, "the verdict is cached"
    assert guest.generate(guest.load_by_name("succ")[1], "y") == (0, "z</s>"), "the host keeps running"


def test_load_bytes_can_be_disabled_or_capped(registry: ModelRegistry, successor_path: pathlib.Path) -> None:
    data = successor_path.read_bytes()
    for limits, errno in (
        (Limits(allow_load_bytes=False), Errno.UNSUPPORTED_OPERATION),
        (Limits(max_load_bytes=len(data) - 1), Errno.TOO_LARGE),
    ):
        guest = AbiGuest.create(WasiNN(registry=registry, limits=limits), memory_pages=80)
        guest.write(0x10000, data)
        guest.write(0x100, struct.pack("<2I", 0x10000, len(data)))
        assert guest.call("load", 0x100, 1, 6, 0, 0x40) == errno


def test_allow_list_per_store(registry: ModelRegistry) -> None:
    nn = WasiNN(registry=registry)
    engine = nn.engine
    linker = wasmtime.Linker(engine)
    nn.add_to_linker(linker)
    from wasinn_host.testing.abi_guest import abi_guest_wat

    module = wasmtime.Module(engine, bytes(wasmtime.wat2wasm(abi_guest_wat())))
    store = wasmtime.Store(engine)
    nn.attach(store, allowed_models=["noisy"])
    instance = linker.instantiate(store, module)
    memory, load = instance.exports(store)["memory"], instance.exports(store)["nn_load_by_name"]
    assert isinstance(memory, wasmtime.Memory) and isinstance(load, wasmtime.Func)
    memory.write(store, b"succ", 0x100)
    assert load(store, 0x100, 4, 0x40) == Errno.NOT_FOUND
    memory.write(store, b"noisy", 0x100)
    assert load(store, 0x100, 5, 0x40) == 0


def test_size_limits(registry: ModelRegistry, caplog: pytest.LogCaptureFixture) -> None:
    nn = WasiNN(registry=registry, limits=Limits(max_prompt_bytes=20, max_output_bytes=10, max_n_predict=50))
    guest = AbiGuest.create(nn)
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    with caplog.at_level("WARNING", logger="wasinn_host"):
        assert guest.set_input(ctx, 0, "a" * 21) == Errno.TOO_LARGE
    one_line(caplog, "max_prompt_bytes=20", "Limits(max_prompt_bytes=", "--max-prompt-bytes")
    assert guest.set_input(ctx, 1, '{"n-predict": 51}') == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 1, '{"n-predict": 50}') == 0
    assert guest.set_input(ctx, 0, "a") == 0
    assert guest.call("compute", ctx) == Errno.TOO_LARGE
    assert guest.get_output(ctx)[1] == b"bcdefghijkl", "the output up to the limit is kept"


def test_inline_images_are_counted_apart_from_the_prompt_limit(registry: ModelRegistry) -> None:
    """WasmEdge's llava-base64-stream example sends a 1,080,186-byte prompt, nearly all of it an inline
    JPEG: max_prompt_bytes (1 MiB by default) counts the text; inline images have the image limit's room."""
    guest = AbiGuest.create(WasiNN(registry=registry), memory_pages=600)  # 37.5 MiB of guest memory
    ctx = guest.init(guest.load_by_name("succ")[1])[1]

    def tag(size: int) -> str:
        return '<img src="data:image/jpeg;base64,' + base64.b64encode(b"\xff" * size).decode() + '">'

    assert guest.set_input(ctx, 0, "USER: " + tag(810_000) + " what is in the picture? ASSISTANT:") == 0
    assert len(tag(810_000)) > 1 << 20
    assert guest.set_input(ctx, 0, "Hi " + tag(20 << 20) + tag(0)) == 0  # one image of the 20 MiB limit
    assert guest.set_input(ctx, 0, "a" * ((1 << 20) + 1)) == Errno.TOO_LARGE  # text alone over the limit
    assert guest.set_input(ctx, 0, "a" * ((1 << 20) + 1) + tag(100)) == Errno.TOO_LARGE
    assert guest.set_input(ctx, 0, tag(20 << 20) + tag(1 << 20)) == Errno.TOO_LARGE  # over text + image room
    assert guest.set_input(ctx, 0, "a" * (1 << 20) + tag(1000)) == 0


def test_kv_memory_limit(successor_path: pathlib.Path) -> None:
    registry = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
    guest = AbiGuest.create(WasiNN(registry=registry, limits=Limits(max_kv_bytes=8 << 20)))
    assert guest.load_by_name("succ", '{"ctx-size": 512, "n-parallel": 2}')[0] == 0  # 1.5 MiB
    rc, _ = guest.load_by_name("succ", '{"ctx-size": 8192, "n-parallel": 4}')
    assert rc == 0, "cached by name: the config is ignored"
    other = AbiGuest.create(WasiNN(registry=registry, limits=Limits(max_kv_bytes=8 << 20)))
    assert other.load_by_name("succ", '{"ctx-size": 8192, "n-parallel": 4}')[0] == Errno.TOO_LARGE
    registry.close()


NEVER_FINISHES = streaming_guest_wat("(call $exit (i32.const 3))")


def test_guest_that_exits_without_fini_or_finalize(nn: WasiNN) -> None:
    module = wasmtime.Module(nn.engine, bytes(wasmtime.wat2wasm(NEVER_FINISHES)))
    before = nn.imports.contexts_alive.value
    assert nn.run(module) == 3
    assert nn.imports.contexts_alive.value == before
    assert nn.imports.state_count() == 0


def test_runaway_guest_is_stopped_by_a_deadline(registry: ModelRegistry) -> None:
    from wasinn_host import RunOptions
    from wasinn_host.launch.runner import run_instances

    nn = WasiNN(registry=registry, interruptible=True)
    spin = wasmtime.Module(
        nn.engine,
        bytes(wasmtime.wat2wasm('(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))')),
    )
    started = time.monotonic()
    (result,) = run_instances(nn, spin, [], RunOptions(), instances=1, timeout=0.3)
    assert result.error == "the guest trapped: stopped by timeout=0.3 (seconds)"  # the parameter it was given
    assert time.monotonic() - started < 10
    assert nn.imports.state_count() == 0


def _counts() -> tuple[int, int]:
    return threading.active_count(), len(os.listdir("/proc/self/fd"))


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024


def test_soak_64_guests_x_50_requests(successor_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    registry = ModelRegistry([f"soak:GGML:AUTO:{successor_path}"])
    nn = WasiNN(registry=registry, limits=Limits(idle_timeout_ms=0))
    warm = AbiGuest.create(nn)
    warm.generate(warm.load_by_name("soak", '{"n-parallel": 16}')[1], "a")
    nn.detach(warm.store)
    del warm
    threads_before, fds_before = _counts()
    rss_before = _rss_mib()
    prompts = ["a", "hello", "Q", "tuv", "m", "xy"]
    failures: list[str] = []

    def guest_body(i: int) -> None:
        guest = AbiGuest.create(nn)
        graph = guest.load_by_name("soak", '{"n-parallel": 16}')[1]
        ctx = guest.init(graph)[1]
        for r in range(50):
            prompt = prompts[(i + r) % len(prompts)]
            if guest.set_input(ctx, 0, prompt) != 0 or guest.call("compute", ctx) != 0:
                failures.append(f"guest {i} request {r}: error")
            elif guest.get_output(ctx)[1].decode() != successor_text(prompt) + "</s>":
                failures.append(f"guest {i} request {r}: wrong output")
        nn.detach(guest.store)

    started = time.monotonic()
    threads = [threading.Thread(target=guest_body, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    elapsed = time.monotonic() - started
    assert not failures, failures[:5]
    assert nn.imports.contexts_alive.value == 0 and nn.imports.state_count() == 0
    threads_after, fds_after = _counts()
    rss_after = _rss_mib()
    with capsys.disabled():
        print(
            f"\nsoak: 3200 requests in {elapsed:.1f} s; threads {threads_before}->{threads_after}, "
            f"fds {fds_before}->{fds_after}, RSS {rss_before:.0f}->{rss_after:.0f} MiB"
        )
    assert threads_after == threads_before
    assert fds_after == fds_before
    assert rss_after - rss_before < 64, "memory must return to where it started (allowing allocator slack)"
    registry.close()


def test_unused_model_instances_do_not_pile_up(successor_path: pathlib.Path) -> None:
    registry = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"], max_idle_models=2)
    nn = WasiNN(registry=registry)
    for k in range(8):  # each distinct load-time config is a model instance
        guest = AbiGuest.create(nn)
        rc, graph = guest.load_by_name("succ", json.dumps({"ctx-size": 16 + k}))
        assert rc == 0 and guest.call("unload", graph) == 0
        nn.detach(guest.store)
    assert len(registry.loaded()) == 2
    # an unused instance also gives way when a new one needs its KV budget
    tight = ModelRegistry([f"succ:GGML:AUTO:{successor_path}"])
    nn = WasiNN(registry=tight, limits=Limits(max_kv_bytes=10 << 20))
    for ctx_size in (1024, 1280):  # 6 and 7.5 MiB of KV cache (4 sequences): not both at once
        guest = AbiGuest.create(nn)
        assert guest.load_by_name("succ", json.dumps({"ctx-size": ctx_size}))[0] == 0
        nn.detach(guest.store)
    assert [m.params.ctx_size for m in tight.loaded()] == [1280]
    registry.close()
    tight.close()
