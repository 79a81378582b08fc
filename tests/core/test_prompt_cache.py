"""The persistent prompt cache (``--nn-prompt-cache``): exact warm starts across processes, and failures.

Every test runs real llama.cpp.  The random model's greedy output depends on the whole prompt, so a
restored KV state that differed from a fresh decode would change the text.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from wasinn_host import ErrorKind, ModelRegistry, WasiNN, WasiNNError
from wasinn_host.core.config.preload import Preload
from wasinn_host.core.prompt_cache.cache import PromptCache
from wasinn_host.core.prompt_cache.entry import TEMP_PREFIX, read_header, read_state, read_tokens, write_entry
from wasinn_host.testing.gguf_models import write_random_model
from wasinn_host.testing.guest_runs import wasinn_cli
from wasinn_host.testing.native_llama import NativeModel
from wasinn_host.testing.vision_models import img_tag, solid_png, write_vision_model

PROMPT = "You are a careful assistant. Answer briefly and exactly. " * 5 + "Question: what is 2+3?"
OTHER_TAIL = "Question: name a colour."
CONFIG = {"temp": 0, "n-predict": 12, "ctx-size": 1024}


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("pc-models") / "random.gguf"
    return write_random_model(
        path, n_layer=2, n_embd=128, n_head=4, n_ff=256, context_length=1024, logit_std=8.0, seed=7
    )


def complete(model: pathlib.Path, prompt: str, cache: PromptCache | str | None, **config: object) -> tuple[str, dict]:
    """One completion on a freshly loaded model (its own registry), as a new process would do it."""
    registry = ModelRegistry([f"default:GGML:AUTO:{model}"])
    nn = WasiNN(registry=registry, prompt_cache=cache)
    try:
        with nn.session("default", {**CONFIG, **config}) as session:
            text = session.complete(prompt)
            return text, session.metadata
    finally:
        nn.close()


def entries(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file())


def cli_run(model: pathlib.Path, prompt: str, *options: str, env: dict[str, str] | None = None) -> tuple[str, dict]:
    result = wasinn_cli(
        *options,
        "--nn-preload",
        f"default:GGML:AUTO:{model}",
        "--env",
        "temp=0",
        "--env",
        "n_predict=12",
        "--env",
        "ctx_size=1024",
        "guest_examples/complete.wasm",
        "default",
        prompt,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    meta = json.loads(result.stderr.strip().splitlines()[-1])
    return result.stdout, meta


def test_wasinn_run_twice_is_a_warm_start_with_the_same_output(
    random_model: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    baseline, meta0 = cli_run(random_model, PROMPT)
    cold, meta1 = cli_run(random_model, PROMPT, "--nn-prompt-cache", str(tmp_path / "cache"))
    warm, meta2 = cli_run(random_model, PROMPT, "--nn-prompt-cache", str(tmp_path / "cache"))
    assert len(baseline) > 4 and baseline == cold == warm
    n = meta0["input_tokens"]
    assert (meta0["reused_tokens"], meta1["reused_tokens"], meta2["reused_tokens"]) == (0, 0, n - 1)
    (entry,) = entries(tmp_path / "cache")
    assert read_header(entry).n_tokens == n


def test_embedding_api_restores_a_shared_prefix_exactly(random_model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "cache"
    first, meta = complete(random_model, PROMPT, str(cache))
    again, meta_again = complete(random_model, PROMPT, str(cache))
    assert first == again and meta["reused_tokens"] == 0 and meta_again["reused_tokens"] == meta["input_tokens"] - 1
    # another question after the same system prompt: the shared prefix is restored, the rest decoded
    other = PROMPT.rsplit("Question:", 1)[0] + OTHER_TAIL
    fresh, _ = complete(random_model, other, None)
    warm, meta_other = complete(random_model, other, PromptCache(cache))
    assert warm == fresh and fresh != first
    shared = len(os.path.commonprefix([PROMPT, other])) + 1  # + BOS
    assert meta_other["reused_tokens"] == shared
    assert len(entries(cache)) == 1  # its 24 new tokens are fewer than MIN_TOKENS: not worth a file


def test_bad_entries_are_ignored_with_one_log_line(
    random_model: pathlib.Path, tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    expected, _ = complete(random_model, PROMPT, str(cache))
    (entry,) = entries(cache)
    good = entry.read_bytes()
    info = read_header(entry)

    def warm_run() -> tuple[str, dict, list[str]]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="wasinn_host"):
            text, meta = complete(random_model, PROMPT, str(cache))
        return text, meta, [r.getMessage() for r in caplog.records if "prompt cache" in r.getMessage()]

    corrupt = bytearray(good)
    corrupt[len(good) // 2] ^= 0xFF
    entry.write_bytes(bytes(corrupt))
    text, meta, lines = warm_run()
    assert (text, meta["reused_tokens"]) == (expected, 0)
    assert len(lines) == 1 and "checksum mismatch" in lines[0] and "removed" in lines[0]
    assert read_state(read_header(entry))  # the run saved a good entry again

    entry.write_bytes(good[: len(good) - 100])
    text, meta, lines = warm_run()
    assert (text, meta["reused_tokens"]) == (expected, 0)
    assert len(lines) == 1 and "truncated" in lines[0]

    # a state llama.cpp cannot use, under the right model and tokens (a valid checksum)
    write_entry(entry, info.model, read_tokens(info), memoryview(b"\x01" * 64))
    text, meta, lines = warm_run()
    assert (text, meta["reused_tokens"]) == (expected, 0)
    assert len(lines) == 1 and "refused" in lines[0]

    # a foreign file is left alone; another model's entries are never used
    entry.write_bytes(good)
    (cache / "notes.txt").write_text("not an entry")
    other_model = write_random_model(tmp_path / "other.gguf", n_layer=2, n_embd=128, n_head=4, n_ff=256, seed=8)
    fresh, _ = complete(other_model, PROMPT, None)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        text, meta = complete(other_model, PROMPT, str(cache))
    lines = [r.getMessage() for r in caplog.records if "prompt cache" in r.getMessage()]
    assert (text, meta["reused_tokens"]) == (fresh, 0)
    assert len(lines) == 1 and "notes.txt" in lines[0] and "not a prompt-cache entry" in lines[0]
    assert (cache / "notes.txt").read_text() == "not an entry"
    text, meta, _ = warm_run()  # the first model still finds its own entry
    assert (text, meta["reused_tokens"]) == (expected, meta["input_tokens"] - 1)


def test_the_directory_stays_within_its_size_bound(random_model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    cache_dir = tmp_path / "cache"
    prompts = [f"{letter} " + PROMPT for letter in "ABCD"]
    complete(random_model, prompts[0], str(cache_dir))
    entry_size = entries(cache_dir)[0].stat().st_size
    cache = PromptCache(cache_dir, max_bytes=int(entry_size * 2.5))
    outputs = []
    for prompt in prompts[1:]:
        outputs.append(complete(random_model, prompt, cache)[0])
        assert sum(p.stat().st_size for p in entries(cache_dir)) <= cache.max_bytes
    kept = {read_header(p).head[1] for p in entries(cache_dir)}
    assert len(kept) == 2 and cache.evictions == 2  # A and B went; C and D, the newest, stay
    # the newest entry serves a warm start; the evicted one is decoded again, with the same output
    assert complete(random_model, prompts[3], cache)[1]["reused_tokens"] > 0
    text, meta = complete(random_model, prompts[1], cache)
    assert (text, meta["reused_tokens"]) == (outputs[0], 0)
    # a state larger than the whole bound is not written
    tiny = PromptCache(tmp_path / "tiny", max_bytes=1000)
    complete(random_model, PROMPT, tiny)
    assert entries(tmp_path / "tiny") == []


WRITER = textwrap.dedent(
    """
    import sys
    from wasinn_host import ModelRegistry, WasiNN
    model, cache, *prompts = sys.argv[1:]
    nn = WasiNN(registry=ModelRegistry([f"default:GGML:AUTO:{model}"]), prompt_cache=cache)
    for prompt in prompts:
        with nn.session("default", {"temp": 0, "n-predict": 4, "ctx-size": 1024}) as session:
            print(session.complete(prompt).encode().hex())
    nn.close()
    """
)


def test_two_processes_writing_at_once(random_model: pathlib.Path, tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "cache"
    shared, own_a, own_b = PROMPT, "A: " + PROMPT, "B: " + PROMPT
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(random_model), str(cache), shared, own],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for own in (own_a, own_b)
    ]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err for _, err in outs]
    assert outs[0][0].split()[0] == outs[1][0].split()[0]  # the shared prompt's answer
    files = entries(cache)
    assert not [p for p in files if p.name.startswith(TEMP_PREFIX)]
    assert len(files) == 3
    for path in files:
        assert read_state(read_header(path))  # whole, with a valid checksum
    text, meta = complete(random_model, shared, str(cache), **{"n-predict": 4})
    assert text.encode().hex() == outs[0][0].split()[0] and meta["reused_tokens"] == meta["input_tokens"] - 1


def test_path_prompt_cache_names_an_entry_inside_the_directory(
    random_model: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    cache = tmp_path / "cache"
    text, _ = complete(random_model, "short prompt", str(cache), **{"path-prompt-cache": "chats/one.bin"})
    named = cache / "chats" / "one.bin"
    assert read_header(named).n_tokens == 13  # BOS + 12 characters
    assert entries(cache) == [named]  # a short prompt is saved only because it was named
    warm, meta = complete(random_model, "short prompt", str(cache), **{"path-prompt-cache": "chats/one.bin"})
    assert warm == text and meta["reused_tokens"] == 12
    for bad in ("../outside", "/etc/passwd", "a/../../b"):
        with pytest.raises(WasiNNError) as err:
            complete(random_model, PROMPT, str(cache), **{"path-prompt-cache": bad})
        assert err.value.kind is ErrorKind.INVALID_ARGUMENT and "path-prompt-cache" in err.value.message
    assert not (tmp_path / "outside").exists()
    # without a cache directory the key is accepted and ignored
    plain, _ = complete(random_model, "short prompt", None, **{"path-prompt-cache": "x"})
    assert plain == text and not (pathlib.Path.cwd() / "x").exists()


def test_wasinn_run_refuses_a_prompt_cache_path_outside_with_errno_1(
    random_model: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    result = wasinn_cli(
        "--nn-prompt-cache",
        str(tmp_path / "cache"),
        "--nn-preload",
        f"default:GGML:AUTO:{random_model}",
        "--env",
        'WASINN_CONFIG={"path-prompt-cache": "../escape"}',
        "guest_examples/complete.wasm",
        "default",
        "abc",
    )
    assert result.returncode == 1
    assert "returned 1" in result.stderr
    logged = [line for line in result.stderr.splitlines() if "path-prompt-cache" in line]
    assert len(logged) == 1, result.stderr
    assert not (tmp_path / "escape").exists()


@pytest.mark.parametrize("kind", ["llava", "qwen2vl"])
def test_prompts_with_images_are_not_saved_and_restore_stops_before_the_image(
    kind: str, tmp_path: pathlib.Path
) -> None:
    text_model, projector = write_vision_model(tmp_path / "models", kind=kind)
    system = "Describe what you see in a few plain words, please. "

    def run(prompt: str, cache: str | None) -> tuple[str, dict]:
        registry = ModelRegistry([Preload("v", text_model, mmproj=projector)])
        nn = WasiNN(registry=registry, prompt_cache=cache)
        try:
            with nn.session("v", {"temp": 0, "n-predict": 8}) as session:
                return session.complete(prompt), session.metadata
        finally:
            nn.close()

    cache = str(tmp_path / "cache")
    with_image = system + img_tag(solid_png(255, 0, 0)) + " cd"
    expected, _ = run(with_image, None)
    assert run(with_image, cache)[0] == expected
    assert entries(tmp_path / "cache") == []  # a prompt with an image is never saved
    run(system + "and nothing else, thank you.", cache)  # a text prompt sharing the system part is
    assert len(entries(tmp_path / "cache")) == 1
    text, meta = run(with_image, cache)
    assert text == expected
    assert meta["reused_tokens"] == len(system) + 1  # BOS and the text before the image; the image is decoded


def test_the_texts_compared_here_lead_by_far_more_than_llama_cpp_moves_them(random_model: pathlib.Path) -> None:
    """A warm start decodes what follows the restored cells in a batch of its own, a cold one the whole
    prompt: llama.cpp computes the two with other kernels, so their logits differ in the last bits
    (:mod:`wasinn_host.testing.numerics`).  The texts compared above are equal on any CPU because every
    greedy step's best token leads by far more than that moves it; measured here on a prompt decoded in
    two pieces (which moves more than a restore does, as it recomputes the first piece too)."""
    native = NativeModel(random_model)
    try:
        for prompt in (PROMPT, PROMPT.rsplit("Question:", 1)[0] + OTHER_TAIL):
            tokens = native.tokenize(prompt.encode())
            text = native.generate(tokens, int(CONFIG["n-predict"]), n_ctx=1024)
            whole = native.follow(tokens, text, n_ctx=1024)
            for cut in (len(tokens) - 1, len(native.tokenize(PROMPT.rsplit("Question:", 1)[0].encode()))):
                pieces = native.follow(tokens, text, n_ctx=1024, split=cut)
                moved = max(abs(w.margin - p.margin) for w, p in zip(whole, pieces))
                assert [p.best for p in pieces] == text
                assert min(w.margin for w in whole) > 2 * moved, (prompt[-24:], cut, moved)
    finally:
        native.close()
