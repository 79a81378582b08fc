"""The prompt cache without llama.cpp: the entry file format, guest entry names, the size option,
and the engine's save and restore rules on the fake runtime."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.backend.fake import FakeRuntime
from wasinn_host.cli.prompt_cache import parse_size
from wasinn_host.core.prompt_cache.cache import MIN_TOKENS, PromptCache, valid_entry_name
from wasinn_host.core.prompt_cache.entry import EntryError, read_header, read_state, read_tokens, write_entry

pytestmark = pytest.mark.fast


def test_an_entry_reads_back_and_every_damage_is_detected(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "e.wnkv"
    size = write_entry(path, "model-a", [1, 2, 3, -4], memoryview(b"state bytes"))
    info = read_header(path)
    assert (info.model, read_tokens(info), info.state_bytes, info.size) == ("model-a", (1, 2, 3, -4), 11, size)
    assert bytes(read_state(info)) == b"state bytes"
    good = path.read_bytes()
    for damaged, why in [
        (good[:-1], "truncated"),
        (good + b"x", "truncated"),
        (b"GGUF" + good[4:], "not a prompt-cache entry"),
        (b"", "not a prompt-cache entry"),
    ]:
        path.write_bytes(damaged)
        with pytest.raises(EntryError, match=why):
            read_header(path)
    flipped = bytearray(good)
    flipped[-40] ^= 1  # inside the state
    path.write_bytes(bytes(flipped))
    with pytest.raises(EntryError, match="checksum") as corrupt:
        read_state(read_header(path))
    assert corrupt.value.corrupt  # removed by the cache
    path.write_bytes(good)
    info = read_header(path)
    write_entry(path, "model-a", [1, 2, 3, 5], memoryview(b"other state"))  # replaced after indexing
    with pytest.raises(EntryError, match="differ") as replaced:
        read_state(info)
    assert not replaced.value.corrupt  # another process's new entry: skipped, never removed
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("", True),
        ("chat", True),
        ("chats/one.bin", True),
        ("../x", False),
        ("a/../../b", False),
        ("/etc/passwd", False),
        ("C:/x", False),
        ("a\\b", False),
        ("./a", True),
        ("a/./b", True),
        (".tmp-x", False),
        ("a\0b", False),
    ],
)
def test_guest_entry_names(name: str, ok: bool) -> None:
    assert valid_entry_name(name) is ok


def test_size_option() -> None:
    assert [parse_size(s) for s in ("1024", "512M", "2G", "1.5GiB", "64k")] == [
        1024,
        512 << 20,
        2 << 30,
        3 << 29,
        64 << 10,
    ]
    for bad in ("", "-1", "0", "12X", "G"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)


def _complete(model: pathlib.Path, cache: PromptCache, prompt: str, stream: int = 0) -> tuple[str, dict]:
    nn = WasiNN(registry=ModelRegistry([f"succ:GGML:AUTO:{model}"], runtime=FakeRuntime()), prompt_cache=cache)
    try:
        with nn.session("succ", {"temp": 0, "n-predict": 8}) as session:
            if stream:
                text = b"".join(session.stream(prompt, max_tokens=stream)).decode()
            else:
                text = session.complete(prompt)
            return text, session.metadata
    finally:
        nn.close()


def test_engine_saves_once_per_prompt_and_restores_in_a_new_registry(
    fake_model: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    cache = PromptCache(tmp_path / "cache")
    prompt = "k" * (MIN_TOKENS + 8)
    first, meta = _complete(fake_model, cache, prompt)
    assert meta["reused_tokens"] == 0 and len(list((tmp_path / "cache").iterdir())) == 1
    again, meta = _complete(fake_model, cache, prompt)
    assert again == first and meta["reused_tokens"] == len(prompt)  # BOS + prompt, less the last token
    # a stream saves the prompt once, not once per step (each step decodes one new token)
    _complete(fake_model, cache, "m" * (MIN_TOKENS + 8), stream=5)
    assert len(list((tmp_path / "cache").iterdir())) == 2
    # a short prompt is not worth a file
    _complete(fake_model, cache, "short")
    assert len(list((tmp_path / "cache").iterdir())) == 2
    assert cache.status()["hits"] == 1
