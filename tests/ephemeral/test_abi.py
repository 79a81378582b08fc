"""ABI behaviour and edge cases, driven through a real wasm instance (see abi_guest.py)."""

from __future__ import annotations

import pathlib
import struct
import tempfile

import pytest
import wasmtime

from wasinn_host import Errno, WasiNN
from wasinn_host.testing.abi_guest import AbiGuest, abi_guest_wat
from wasinn_host.testing.gguf_models import successor_text

ALPHABET = "bcdefghijklmnopqrstuvwxyz"


@pytest.fixture
def nn(any_nn: WasiNN) -> WasiNN:
    """Every ABI test runs on llama.cpp and on the fake runtime."""
    return any_nn


@pytest.fixture
def guest(nn: WasiNN) -> AbiGuest:
    return AbiGuest.create(nn)


def loaded(guest: AbiGuest, name: str = "succ", config: str | None = None) -> int:
    rc, graph = guest.load_by_name(name, config)
    assert rc == 0
    return graph


def test_completion_includes_eog_piece_and_metadata(guest: AbiGuest) -> None:
    graph = loaded(guest)
    rc, ctx = guest.init(graph)
    assert (rc, ctx) == (0, 0)
    assert guest.set_input(ctx, 0, "a") == 0
    # input_tokens is readable before compute (guests do this)
    rc, meta = guest.get_output(ctx, 1)
    assert rc == 0
    runtime = guest.nn.registry.runtime
    assert meta.decode() == (
        f'{{"input_tokens": 2, "output_tokens": 0, "llama_build_number": {runtime.build_number}, '
        f'"llama_commit": "{runtime.commit}"}}'
    )
    assert guest.call("compute", ctx) == 0
    assert guest.get_output(ctx) == (0, (ALPHABET + "</s>").encode())
    rc, meta = guest.get_output(ctx, 1)
    assert meta.startswith(b'{"input_tokens": 2, "output_tokens": 26, "llama_build_number": ')


def test_handles_start_at_zero_per_store_and_are_never_reused(nn: WasiNN) -> None:
    first, second = AbiGuest.create(nn), AbiGuest.create(nn)
    g1, g2 = loaded(first), loaded(second)
    assert (g1, g2) == (0, 0)
    assert first.load_by_name("succ") == (0, 0), "same name returns the cached handle"
    assert [first.init(g1) for _ in range(3)] == [(0, 0), (0, 1), (0, 2)]
    assert first.call("finalize_execution_context", 1) == 0
    assert first.init(g1) == (0, 3)
    assert second.init(g2) == (0, 0)
    # another store's handle numbers mean nothing here
    assert second.call("compute", 3) == Errno.INVALID_ARGUMENT


def test_bad_handles_return_invalid_argument(guest: AbiGuest) -> None:
    graph = loaded(guest)
    assert guest.init(graph + 7)[0] == Errno.INVALID_ARGUMENT
    for name in ("compute", "compute_single", "fini_single", "finalize_execution_context", "unload"):
        assert guest.call(name, 42) == Errno.INVALID_ARGUMENT, name
    assert guest.set_input(42, 0, "a") == Errno.INVALID_ARGUMENT
    assert guest.get_output(42)[0] == Errno.INVALID_ARGUMENT
    assert guest.get_output(42, single=True)[0] == Errno.INVALID_ARGUMENT
    assert guest.call("compute", 0xFFFF_FFFF) == Errno.INVALID_ARGUMENT


def test_out_of_bounds_pointers_are_rejected_and_memory_untouched(guest: AbiGuest) -> None:
    size = guest.size
    graph = loaded(guest)
    before = guest.read(0, size)
    assert guest.call("load_by_name", size - 2, 10, guest.OUT32) == Errno.INVALID_ARGUMENT
    assert guest.call("load_by_name", 0xFFFF_FFFF, 4, guest.OUT32) == Errno.INVALID_ARGUMENT
    guest.write(guest.NAME, b"succ")
    assert guest.call("load_by_name", guest.NAME, 4, size - 3) == Errno.INVALID_ARGUMENT
    assert guest.call("load_by_name_with_config", guest.NAME, 4, size, 1, guest.OUT32) == Errno.INVALID_ARGUMENT
    assert guest.call("init_execution_context", graph, size) == Errno.INVALID_ARGUMENT
    assert guest.read(0, size) == before, "a failed call wrote to guest memory"
    ctx = guest.init(graph)[1]
    assert guest.call("set_input", ctx, 0, size - 19) == Errno.INVALID_ARGUMENT
    # tensor data, dims out of bounds
    guest.write(guest.TENSOR, struct.pack("<5I", guest.DIMS, 1, 3, size - 1, 2))
    guest.write(guest.DIMS, struct.pack("<I", 2))
    assert guest.call("set_input", ctx, 0, guest.TENSOR) == Errno.INVALID_ARGUMENT
    guest.write(guest.TENSOR, struct.pack("<5I", size - 2, 1, 3, guest.DATA, 1))
    assert guest.call("set_input", ctx, 0, guest.TENSOR) == Errno.INVALID_ARGUMENT
    guest.write(guest.TENSOR, struct.pack("<5I", guest.DIMS, 0x4000_0000, 3, guest.DATA, 1))
    assert guest.call("set_input", ctx, 0, guest.TENSOR) == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 0, "a") == 0
    assert guest.call("compute", ctx) == 0
    assert guest.call("get_output", ctx, 0, size - 4, 100, guest.OUT32) == Errno.INVALID_ARGUMENT
    assert guest.call("get_output", ctx, 0, guest.BUF, 100, size - 1) == Errno.INVALID_ARGUMENT
    assert guest.call("get_output_single", ctx, 0, guest.BUF, 0xFFFF_FFFF, guest.OUT32) == Errno.INVALID_ARGUMENT


def test_output_buffer_one_byte_too_small(guest: AbiGuest) -> None:
    graph = loaded(guest)
    rc, ctx = guest.init(graph)
    guest.set_input(ctx, 0, "a")
    assert guest.call("compute", ctx) == 0
    needed = len(ALPHABET) + len("</s>")
    guest.write(guest.BUF, b"\xaa" * 64)
    guest.write(guest.OUT32, b"\0\0\0\0")
    assert guest.call("get_output", ctx, 0, guest.BUF, needed - 1, guest.OUT32) == Errno.TOO_LARGE
    assert guest.u32(guest.OUT32) == needed
    assert guest.read(guest.BUF, 64) == b"\xaa" * 64, "nothing may be copied on TooLarge"
    assert guest.call("get_output", ctx, 0, guest.BUF, needed, guest.OUT32) == 0
    assert guest.read(guest.BUF, needed) == (ALPHABET + "</s>").encode()
    # metadata too
    meta_len = len(guest.get_output(ctx, 1)[1])
    assert guest.call("get_output", ctx, 1, guest.BUF, meta_len - 1, guest.OUT32) == Errno.TOO_LARGE
    assert guest.u32(guest.OUT32) == meta_len


@pytest.mark.parametrize(
    "ttype,expected", [(3, 0), (2, 0), (0x1234_5603, 0), (0, 0), (1, 0), (4, 0), (5, 1), (6, 1), (0xFF, 1)]
)
def test_tensor_types(guest: AbiGuest, ttype: int, expected: int) -> None:
    ctx = guest.init(loaded(guest))[1]
    assert guest.set_input(ctx, 0, "a", ttype=ttype) == expected


def test_tensor_dims(guest: AbiGuest) -> None:
    ctx = guest.init(loaded(guest))[1]
    for dims, expected in (([1], 0), ([1, 1], 0), ([3], 0), ([1, 3], 0), ([], 0), ([2], 1), ([5, 5], 1)):
        assert guest.call("set_input", ctx, 0, guest.tensor(b"abc", dims=dims)) == expected, dims


def test_invalid_json_and_wrong_value_types(guest: AbiGuest) -> None:
    assert guest.load_by_name("succ", "{not json")[0] == Errno.INVALID_ENCODING
    assert guest.load_by_name("succ", '{"ctx-size": "big"}')[0] == Errno.INVALID_ARGUMENT
    ctx = guest.init(loaded(guest))[1]
    assert guest.set_input(ctx, 1, "{") == Errno.INVALID_ENCODING
    assert guest.set_input(ctx, 1, "[1, 2]") == Errno.INVALID_ENCODING
    assert guest.set_input(ctx, 1, '{"n-predict": "5"}') == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 1, '{"n-predict": 5.0}') == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 1, '{"stream-stdout": 1}') == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 1, '{"temp": "hot"}') == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 1, '{"reverse-prompt": 3}') == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 1, '{"top-p": 1.5}') == Errno.INVALID_ARGUMENT
    # unknown keys are ignored, known ones applied
    assert guest.set_input(ctx, 1, '{"llama3": true, "include_usage": 1, "n-predict": 3, "temp": 0}') == 0
    assert guest.set_input(ctx, 0, "a") == 0
    assert guest.call("compute", ctx) == 0
    assert guest.get_output(ctx) == (0, b"bcd")


def test_rejections_are_logged_in_one_line(guest: AbiGuest, caplog: pytest.LogCaptureFixture) -> None:
    ctx = guest.init(loaded(guest))[1]
    with caplog.at_level("WARNING", logger="wasinn_host"):
        assert guest.set_input(ctx, 1, '{"top-p": 1.5}') == Errno.INVALID_ARGUMENT
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "top-p" in lines[0] and "1.5" in lines[0] and "0.0 to 1.0" in lines[0]


def test_unknown_name_and_missing_file(guest: AbiGuest) -> None:
    assert guest.load_by_name("nope") == (Errno.NOT_FOUND, 0xEEEE_EEEE)
    assert guest.load_by_name("missing")[0] == Errno.MODEL_NOT_FOUND
    assert guest.load_by_name("Succ")[0] == Errno.NOT_FOUND, "names are case-sensitive"


def test_unload_then_use(guest: AbiGuest) -> None:
    graph = loaded(guest)
    ctx = guest.init(graph)[1]
    assert guest.set_input(ctx, 0, "x") == 0
    assert guest.call("compute", ctx) == 0
    assert guest.call("unload", graph) == 0
    assert guest.call("unload", graph) == Errno.INVALID_ARGUMENT
    assert guest.init(graph)[0] == Errno.INVALID_ARGUMENT
    assert guest.get_output(ctx) == (0, b"yz</s>"), "a live context drains after unload"
    assert guest.call("compute", ctx) == Errno.INVALID_ARGUMENT
    assert guest.load_by_name("succ") == (0, 1), "a reload gets a new handle"


def test_finalize_twice(guest: AbiGuest) -> None:
    ctx = guest.init(loaded(guest))[1]
    assert guest.call("finalize_execution_context", ctx) == 0
    assert guest.call("finalize_execution_context", ctx) == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 0, "a") == Errno.INVALID_ARGUMENT


def test_compute_before_set_input(guest: AbiGuest) -> None:
    ctx = guest.init(loaded(guest))[1]
    assert guest.call("compute", ctx) == Errno.INVALID_ARGUMENT
    assert guest.call("compute_single", ctx) == Errno.INVALID_ARGUMENT
    assert guest.get_output(ctx) == (0, b""), "output is empty before the first compute"


def test_prompt_too_long(guest: AbiGuest) -> None:
    graph = loaded(guest, config='{"ctx-size": 64}')
    ctx = guest.init(graph)[1]
    assert guest.set_input(ctx, 1, '{"n-predict": 2}') == 0
    assert guest.set_input(ctx, 0, "a" * 59) == 0  # 60 tokens with BOS = 64 - 4: accepted
    assert guest.call("compute", ctx) == 0
    assert guest.set_input(ctx, 0, "a" * 60) == 0
    assert guest.call("compute", ctx) == Errno.PROMPT_TOO_LONG
    assert guest.call("compute_single", ctx) == Errno.PROMPT_TOO_LONG


def test_generation_fills_the_context(guest: AbiGuest) -> None:
    graph = loaded(guest, config='{"ctx-size": 64}')
    rc, text = guest.generate(graph, "7")
    assert rc == Errno.CONTEXT_FULL
    assert text == successor_text("7", 63), "the output so far is kept"


def test_n_predict_and_reverse_prompt(guest: AbiGuest) -> None:
    graph = loaded(guest)
    assert guest.generate(graph, "a", '{"n-predict": 5}') == (0, "bcdef")
    assert guest.generate(graph, "a", '{"n-predict": 0}') == (0, "")
    assert guest.generate(graph, "a", '{"reverse-prompt": "ghi"}') == (0, "bcdefghi")
    assert guest.generate(graph, "7", '{"n-predict": 12}') == (0, "890123456789")


def test_streaming(guest: AbiGuest) -> None:
    ctx = guest.init(loaded(guest))[1]
    assert guest.set_input(ctx, 0, "w") == 0
    assert guest.get_output(ctx, single=True) == (0, b"")
    pieces = []
    while (rc := guest.call("compute_single", ctx)) == 0:
        pieces.append(guest.get_output(ctx, single=True)[1])
    assert rc == Errno.END_OF_SEQUENCE
    assert pieces == [b"x", b"y", b"z"]
    assert guest.get_output(ctx, single=True) == (0, b"</s>"), "the EOG token is appended"
    assert guest.get_output(ctx) == (0, b"xyz</s>")
    assert guest.get_output(ctx, 1)[1].startswith(b'{"input_tokens": 2, "output_tokens": 4,')
    # after EndOfSequence the next call starts again from the prompt
    assert guest.call("compute_single", ctx) == 0
    assert guest.get_output(ctx) == (0, b"x")
    assert guest.call("fini_single", ctx) == 0
    assert guest.get_output(ctx) == (0, b"")
    assert guest.call("compute_single", ctx) == 0
    assert guest.get_output(ctx, single=True) == (0, b"x")
    # set_input also restarts the stream
    assert guest.set_input(ctx, 0, "5") == 0
    assert guest.call("compute_single", ctx) == 0 and guest.call("compute_single", ctx) == 0
    assert guest.get_output(ctx) == (0, b"67")


def test_streaming_context_full(guest: AbiGuest) -> None:
    ctx = guest.init(loaded(guest, config='{"ctx-size": 16}'))[1]
    assert guest.set_input(ctx, 0, "0") == 0
    codes = [guest.call("compute_single", ctx) for _ in range(15)]
    assert codes == [0] * 14 + [Errno.CONTEXT_FULL]
    assert guest.get_output(ctx)[1].decode() == successor_text("0", 15)


def test_metadata_load_time_keys_are_not_applied(guest: AbiGuest, caplog: pytest.LogCaptureFixture) -> None:
    graph = loaded(guest, config='{"ctx-size": 64}')
    ctx = guest.init(graph)[1]
    with caplog.at_level("WARNING", logger="wasinn_host"):
        assert guest.set_input(ctx, 1, '{"ctx-size": 4096, "n-predict": 100}') == 0
    assert any("ctx-size" in r.getMessage() and "load" in r.getMessage() for r in caplog.records)
    assert guest.set_input(ctx, 0, "7") == 0
    assert guest.call("compute", ctx) == Errno.CONTEXT_FULL, "still the 64-token context"


def _load_bytes(
    guest: AbiGuest, model: bytes, encoding: int = 6, target: int = 0, config: bytes | None = None
) -> tuple[int, int]:
    grown = guest.memory.grow(guest.store, (len(model) + 0x10000) // 0x10000 + 1)
    base = grown * 0x10000
    guest.write(base, model)
    builders = struct.pack("<2I", base, len(model))
    if config is not None:
        guest.write(guest.CONFIG, config)
        builders += struct.pack("<2I", guest.CONFIG, len(config))
    guest.write(guest.NAME, builders)
    guest.write(guest.OUT32, b"\xee" * 4)
    rc = guest.call("load", guest.NAME, len(builders) // 8, encoding, target, guest.OUT32)
    return rc, guest.u32(guest.OUT32)


def test_load_from_guest_bytes(
    guest: AbiGuest, successor_path: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = successor_path.read_bytes()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the host writes its temporary copy
    rc, graph = _load_bytes(guest, model, config=b'{"n-predict": 4}')
    assert (rc, graph) == (0, 0)
    assert list(tmp_path.iterdir()) == [], "load must leave no file behind"
    assert guest.generate(graph, "p") == (0, "qrst")
    assert _load_bytes(guest, model, target=3)[0] == Errno.INVALID_ARGUMENT, "AUTO is rejected by load"
    assert _load_bytes(guest, model, encoding=1)[0] == Errno.INVALID_ENCODING
    assert _load_bytes(guest, model, encoding=99)[0] == Errno.INVALID_ENCODING
    assert _load_bytes(guest, b"preload:" + str(successor_path).encode())[0] == Errno.INVALID_ARGUMENT
    assert _load_bytes(guest, b"GGUF not really a model")[0] == Errno.INVALID_ARGUMENT
    assert _load_bytes(guest, model, config=b"{oops")[0] == Errno.INVALID_ENCODING
    assert guest.call("load", guest.NAME, 0, 6, 0, guest.OUT32) == Errno.INVALID_ARGUMENT


def test_module_without_memory_traps(nn: WasiNN) -> None:
    linker = wasmtime.Linker(nn.engine)
    nn.add_to_linker(linker)
    store = wasmtime.Store(nn.engine)
    nn.attach(store)
    module = wasmtime.Module(nn.engine, bytes(wasmtime.wat2wasm(abi_guest_wat(export_memory=False))))
    instance = linker.instantiate(store, module)
    compute = instance.exports(store)["nn_compute"]
    assert isinstance(compute, wasmtime.Func)
    with pytest.raises(wasmtime.WasmtimeError, match="exports no memory"):
        compute(store, 0)
