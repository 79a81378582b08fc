"""Images reach the model: the project's tiny vision model (random CLIP projector + text model) through the host.

A different image changes the greedy answer, the same image reproduces it, the image's tokens are
counted in ``input_tokens``, a repeated image is served from the KV cache, and every bad input
(corrupt or oversized image, a foreign projector, no projector) is an invalid argument, not a crash.
"""

from __future__ import annotations

import concurrent.futures
import json
import pathlib
import struct
import subprocess
import threading
from collections.abc import Iterator

import pytest
import wasmtime

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.preload import Preload
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.core.images import MAX_IMAGE_PIXELS, place_image, split_inline_images
from wasinn_host.testing.abi_guest import AbiGuest, abi_guest_wat
from wasinn_host.testing.guest_runs import wasinn_cli
from wasinn_host.testing.vision_models import IMAGE_TOKENS, img_tag, png_bytes, solid_png, write_vision_model

GREEDY = {"temp": 0, "n-predict": 8}
RED, BLUE, GREEN = solid_png(255, 0, 0), solid_png(0, 0, 255), solid_png(0, 255, 0)


@pytest.fixture(scope="module")
def vision_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    return write_vision_model(tmp_path_factory.mktemp("vision"))


@pytest.fixture(scope="module")
def vision_nn(vision_files: tuple[pathlib.Path, pathlib.Path]) -> Iterator[WasiNN]:
    """``v``: the text model with its projector; ``t``: the same text model alone."""
    text, projector = vision_files
    registry = ModelRegistry([Preload("v", text, mmproj=projector), Preload("t", text)])
    yield WasiNN(registry=registry)
    registry.close()


def answer(nn: WasiNN, prompt: str, name: str = "v") -> tuple[str, dict[str, int]]:
    with nn.session(name, GREEDY) as session:
        text = session.complete(prompt)
        return text, {k: v for k, v in session.metadata.items() if isinstance(v, int)}


def test_a_different_image_changes_the_answer_and_the_same_image_reproduces_it(vision_nn: WasiNN) -> None:
    red = answer(vision_nn, f"ab {img_tag(RED)} cd")[0]
    blue = answer(vision_nn, f"ab {img_tag(BLUE)} cd")[0]
    green = answer(vision_nn, f"ab {img_tag(GREEN)} cd")[0]
    assert len({red, blue, green}) == 3, "the pixels reach the model"
    assert answer(vision_nn, f"ab {img_tag(RED)} cd")[0] == red
    assert answer(vision_nn, "ab  cd")[0] not in (red, blue, green), "no image: yet another answer"


def test_image_tokens_are_counted_in_input_tokens(vision_nn: WasiNN) -> None:
    without = answer(vision_nn, "ab  cd")[1]["input_tokens"]
    with_one = answer(vision_nn, f"ab {img_tag(RED)} cd")[1]["input_tokens"]
    with_two = answer(vision_nn, f"ab {img_tag(RED)} c{img_tag(BLUE)}d")[1]["input_tokens"]
    assert with_one == without + IMAGE_TOKENS
    assert with_two == without + 2 * IMAGE_TOKENS


def test_the_same_image_in_the_next_turn_comes_from_the_kv_cache(vision_nn: WasiNN) -> None:
    first = f"ab {img_tag(RED)} cd"
    with vision_nn.session("v", GREEDY) as session:
        reply = session.complete(first)
        n_first = session.metadata["input_tokens"]
        second = first + reply + " ef"
        again = session.complete(second)
        assert session.metadata["reused_tokens"] >= n_first, "prompt and image are not decoded again"
    assert answer(vision_nn, second)[0] == again, "greedy output identical to a fresh decode"
    with vision_nn.session("v", GREEDY) as session:
        session.complete(first)
        session.complete(f"ab {img_tag(BLUE)} cd")
        assert session.metadata["reused_tokens"] < 1 + IMAGE_TOKENS, "a different image is decoded again"


def test_jpeg_magic_with_bad_data_gif_and_text_are_refused(vision_nn: WasiNN) -> None:
    corrupt_png = RED[:40] + b"\x00" * 30
    with vision_nn.session("v", GREEDY) as session:
        for image in (corrupt_png, b"\xff\xd8\xff\xe0 no frame", b"plain text, not an image"):
            with pytest.raises(WasiNNError) as err:
                session.complete(f"ab {img_tag(image)} cd")
            assert err.value.kind is ErrorKind.INVALID_ARGUMENT
        assert session.complete(f"ab {img_tag(RED)} cd"), "the context still works after refusals"


def test_an_image_too_large_is_refused_from_its_header() -> None:
    huge = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", 50000, 50000) + b"\x08\x02"
    from wasinn_host.core.images import check_image

    with pytest.raises(WasiNNError, match=f"accepted: 1 to {MAX_IMAGE_PIXELS} pixels"):
        check_image(huge)
    check_image(png_bytes(8, 8, [1, 2, 3] * 64))


def test_an_image_must_be_followed_by_text(vision_nn: WasiNN) -> None:
    with vision_nn.session("v", GREEDY) as session, pytest.raises(WasiNNError, match="followed by text"):
        session.complete(f"ab {img_tag(RED)}")


def test_the_guests_mmproj_key_may_only_name_the_configured_projector(
    vision_nn: WasiNN, vision_files: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    projector = vision_files[1]
    for same in (str(projector), projector.name):
        with vision_nn.session("v", {**GREEDY, "mmproj": same}) as session:
            assert session.complete(f"ab {img_tag(RED)} cd") == answer(vision_nn, f"ab {img_tag(RED)} cd")[0]
    other = tmp_path / "other.gguf"
    other.write_bytes(projector.read_bytes())
    for name in ("v", "t"):
        with pytest.raises(WasiNNError) as err:
            vision_nn.session(name, {"mmproj": str(other)})
        assert err.value.kind is ErrorKind.INVALID_ARGUMENT


def test_a_model_without_projector_keeps_img_tags_as_text_and_refuses_the_image_key(vision_nn: WasiNN) -> None:
    text, meta = answer(vision_nn, f"ab {img_tag(RED)} cd", name="t")
    assert meta["input_tokens"] > 100, "the tag is ordinary text there"
    with vision_nn.session("t", {**GREEDY, "image": "/photo.png"}) as session, pytest.raises(WasiNNError) as err:
        session.complete("ab cd")
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT and "no multimodal projector" in err.value.message


def test_inline_tags_and_image_key_placement() -> None:
    text, images = split_inline_images(b"x " + img_tag(RED).encode() + b" y " + img_tag(BLUE, "jpeg").encode(), b"<M>")
    assert (text, images) == (b"x <M> y <M>", [RED, BLUE])
    assert place_image(b"a <M> b", [RED], BLUE, b"<M>") == (b"<M>a <M> b", [BLUE, RED]), "no <image>: before the text"
    assert place_image(b"a <M> b <image> c", [RED], BLUE, b"<M>") == (b"a <M> b <M> c", [RED, BLUE])
    with pytest.raises(WasiNNError, match="not valid base64"):
        split_inline_images(b'<img src="data:image/png;base64,abcde">', b"<M>")


# -- the image key through a guest's preopened directories ------------------------------


def guest_with_dirs(nn: WasiNN, dirs: list[tuple[str, str]]) -> AbiGuest:
    """The ABI guest in a Store whose preopened directories are ``dirs``."""
    linker = wasmtime.Linker(nn.engine)
    nn.add_to_linker(linker)
    store = wasmtime.Store(nn.engine)
    nn.imports.attach(store, None, dirs)
    module = wasmtime.Module(nn.engine, bytes(wasmtime.wat2wasm(abi_guest_wat())))
    instance = linker.instantiate(store, module)
    memory = instance.exports(store)["memory"]
    assert isinstance(memory, wasmtime.Memory)
    return AbiGuest(nn, store, instance, memory)


def guest_answer(guest: AbiGuest, image: str, prompt: str) -> tuple[int, str]:
    rc, graph = guest.load_by_name("v")
    assert rc == 0
    rc, ctx = guest.init(graph)
    assert rc == 0
    assert guest.set_input(ctx, 1, json.dumps({**GREEDY, "image": image})) == 0
    rc = guest.set_input(ctx, 0, prompt)
    if rc != 0:
        return rc, ""
    assert guest.call("compute", ctx) == 0
    out_rc, text = guest.get_output(ctx)
    assert out_rc == 0
    return 0, text.decode("utf-8", "replace")


@pytest.fixture
def photos(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "red.png").write_bytes(RED)
    (tmp_path / "photos" / "blue.png").write_bytes(BLUE)
    (tmp_path / "secret.png").write_bytes(GREEN)
    (tmp_path / "photos" / "link.png").symlink_to(tmp_path / "secret.png")
    return tmp_path / "photos"


def test_image_key_reads_the_guests_file_and_places_it_like_an_inline_image(
    vision_nn: WasiNN, photos: pathlib.Path
) -> None:
    guest = guest_with_dirs(vision_nn, [(str(photos), "/data")])
    red = guest_answer(guest, "/data/red.png", "ab  cd")
    assert red == (0, answer(vision_nn, f"{img_tag(RED)}ab  cd")[0]), "no <image> marker: the image goes first"
    assert guest_answer(guest, "/data/blue.png", "ab  cd") == (0, answer(vision_nn, f"{img_tag(BLUE)}ab  cd")[0])
    assert guest_answer(guest, "/data/blue.png", "ab  cd") != red
    marked = guest_answer(guest, "/data/red.png", "ab <image> cd")
    assert marked == (0, answer(vision_nn, f"ab {img_tag(RED)} cd")[0]), "at the model's <image> marker"
    relative = guest_with_dirs(vision_nn, [(str(photos), ".")])
    assert guest_answer(relative, "red.png", "ab  cd") == red


def test_a_python_session_reads_image_files_through_its_dirs_like_a_guest(
    vision_nn: WasiNN, photos: pathlib.Path
) -> None:
    dirs = [(str(photos), "/data")]
    with vision_nn.session("v", {**GREEDY, "image": "/data/blue.png"}, dirs=dirs) as session:
        assert session.complete("ab <image> cd") == answer(vision_nn, f"ab {img_tag(BLUE)} cd")[0]
    with vision_nn.session("v", {**GREEDY, "image": "/data/../secret.png"}, dirs=dirs) as session:
        with pytest.raises(WasiNNError, match="outside the guest's preopened directories"):
            session.complete("ab <image> cd")
    with vision_nn.session("v", {**GREEDY, "image": "/data/blue.png"}) as session:
        with pytest.raises(WasiNNError, match="cannot read files"):
            session.complete("ab <image> cd")


@pytest.mark.parametrize("path", ["/etc/hostname", "/data/../secret.png", "/data/link.png", "/data/missing.png", "x"])
def test_image_key_outside_the_preopened_directories_is_errno_1(
    path: str, vision_nn: WasiNN, photos: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    guest = guest_with_dirs(vision_nn, [(str(photos), "/data")])
    with caplog.at_level("WARNING", logger="wasinn_host"):
        assert guest_answer(guest, path, "ab  cd") == (1, "")
    assert any(path in r.getMessage() for r in caplog.records), "one log line names the refused path"


def test_no_preopened_directories_means_no_image_files(vision_nn: WasiNN, photos: pathlib.Path) -> None:
    assert guest_answer(guest_with_dirs(vision_nn, []), str(photos / "red.png"), "ab  cd") == (1, "")


def test_many_contexts_with_images_at_once_match_one_at_a_time(vision_nn: WasiNN) -> None:
    """Eight contexts with different images decode together; the model grows its sequences meanwhile
    (4 to start), so images are decoded again after the move, and every answer is still the sequential one."""
    images = [solid_png(30 * i, 255 - 30 * i, (70 * i) % 256) for i in range(8)]
    prompts = [f"a{i} {img_tag(image)} b" for i, image in enumerate(images)]
    expected = [answer(vision_nn, prompt)[0] for prompt in prompts]
    assert len(set(expected)) == 8
    barrier = threading.Barrier(len(prompts))
    config = {**GREEDY, "ctx-size": 256}  # a model instance of its own, starting with 4 sequences

    def run(prompt: str) -> str:
        with vision_nn.session("v", config) as session:
            barrier.wait()
            return session.complete(prompt)

    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(run, prompts)) == expected
    (model,) = [m for m in vision_nn.registry.loaded() if m.params.ctx_size == 256]
    assert model.worker.growths >= 1 and model.worker.context.n_seq >= 8


def test_context_shift_after_an_image_keeps_generating(vision_nn: WasiNN) -> None:
    """The image starts at token 32, where the shift leaves the sequence: it must not be decoded again there."""
    config = {"temp": 0, "n-predict": 60, "ctx-size": 64, "ctx-shift": True, "ignore-eos": True}
    with vision_nn.session("v", config) as session:
        session.complete(f"{'a' * 31}{img_tag(RED)}cd")
        meta = session.metadata
        assert (meta["stop_reason"], meta["output_tokens"]) == ("n-predict", 60)
        (model,) = [m for m in vision_nn.registry.loaded() if m.params.ctx_size == 64]
        assert model.worker.decoded_tokens == meta["input_tokens"] + 60 - 1, "each token decoded once"
        assert session.complete("ab cd"), "the context goes on after the shift"


# -- wasinn run: --nn-mmproj, --dir and a C guest configured from its environment -------------


def test_wasinn_run_serves_images_to_a_guest_configured_from_its_environment(
    vision_nn: WasiNN, vision_files: tuple[pathlib.Path, pathlib.Path], photos: pathlib.Path
) -> None:
    text, projector = vision_files

    def run(image: str, prompt: str, *extra: str) -> subprocess.CompletedProcess[str]:
        config = json.dumps({**GREEDY, "image": image, "mmproj": projector.name})
        return wasinn_cli(
            f"--nn-preload=v:GGML:AUTO:{text}",
            f"--nn-mmproj=v:{projector}",
            f"--dir={photos}::/data",
            f"--env=WASINN_CONFIG={config}",
            *extra,
            "guest_examples/complete.wasm",
            "v",
            prompt,
        )

    red, blue = run("/data/red.png", "ab  cd"), run("/data/blue.png", "ab  cd")
    assert red.returncode == 0, red.stderr
    assert red.stdout.rstrip("\n") == answer(vision_nn, f"{img_tag(RED)}ab  cd")[0]
    assert blue.returncode == 0 and blue.stdout != red.stdout
    assert f'"input_tokens":{1 + 6 + IMAGE_TOKENS}' in red.stderr.replace(" ", ""), "the metadata counts the image"
    outside = run("/etc/hostname", "ab  cd")
    assert outside.returncode != 0 and "outside the guest's preopened directories" in outside.stderr


def test_nn_mmproj_must_name_a_preloaded_model() -> None:
    result = wasinn_cli("--nn-preload=v:GGML:AUTO:m.gguf", "--nn-mmproj=w:p.gguf", "guest_examples/complete.wasm")
    assert result.returncode == 2
    assert result.stderr.strip() == "wasinn: error: --nn-mmproj 'w:p.gguf': 'w' is not a --nn-preload name"


@pytest.mark.parametrize("base64", ["0", "1"])
def test_llava_guest_with_the_image_key_or_inline_base64(
    base64: str, vision_nn: WasiNN, vision_files: tuple[pathlib.Path, pathlib.Path], photos: pathlib.Path
) -> None:
    """guest_examples/llava.wasm does what WasmEdge's llava (image key, one compute) and llava-base64-stream
    (the file read by the guest, sent inline, streamed) examples do; both give the host's answer."""
    text, projector = vision_files

    def run(image: str) -> subprocess.CompletedProcess[str]:
        env = [f"--env=image={image}", f"--env=mmproj={projector.name}", f"--env=base64={base64}"]
        return wasinn_cli(
            f"--nn-preload=v:GGML:AUTO:{text}",
            f"--nn-mmproj=v:{projector}",
            f"--dir={photos}::/data",
            *env,
            "--env=temp=0",
            "--env=n_predict=8",
            "guest_examples/llava.wasm",
            "v",
            "what is it?",
        )

    red, blue = run("/data/red.png"), run("/data/blue.png")
    assert red.returncode == 0, red.stderr
    assert red.stdout.rstrip("\n") == answer(vision_nn, f"USER: {img_tag(RED)}\nwhat is it?\nASSISTANT:")[0]
    assert blue.returncode == 0 and blue.stdout != red.stdout
    missing = run("/data/none.png")
    assert missing.returncode == 1 and missing.stdout == ""


def test_a_gemma3_style_projector_decodes_its_image_non_causally(tmp_path: pathlib.Path) -> None:
    """Gemma 3's projector: libmtmd decodes the image tokens with non-causal attention inside this host's
    multi-sequence context; the image still decides the answer, and text decoding stays causal after it."""
    text, projector = write_vision_model(tmp_path, kind="gemma3")
    registry = ModelRegistry([Preload("g", text, mmproj=projector)])
    try:
        nn = WasiNN(registry=registry)
        red, blue = answer(nn, f"ab {img_tag(RED)} cd", "g"), answer(nn, f"ab {img_tag(BLUE)} cd", "g")
        assert red[0] != blue[0] and answer(nn, f"ab {img_tag(RED)} cd", "g")[0] == red[0]
        assert red[1]["input_tokens"] - answer(nn, "ab  cd", "g")[1]["input_tokens"] > IMAGE_TOKENS, (
            "16 image tokens plus Gemma 3's <start_of_image> / <end_of_image> text"
        )
        with nn.session("g", GREEDY) as session:  # a follow-up turn reuses the image's cells
            first = session.complete(f"ab {img_tag(RED)} cd")
            session.complete(f"ab {img_tag(RED)} cd{first} more")
            assert session.metadata["reused_tokens"] >= red[1]["input_tokens"]
    finally:
        registry.close()


def test_load_from_guest_bytes_refuses_a_projector(
    vision_nn: WasiNN, vision_files: tuple[pathlib.Path, pathlib.Path]
) -> None:
    text, projector = vision_files
    guest = guest_with_dirs(vision_nn, [])
    model = text.read_bytes()
    base = guest.memory.grow(guest.store, len(model) // 0x10000 + 2) * 0x10000
    guest.write(base, model)
    config = json.dumps({"mmproj": str(projector)}).encode()
    guest.write(guest.CONFIG, config)
    guest.write(guest.NAME, struct.pack("<4I", base, len(model), guest.CONFIG, len(config)))
    assert guest.call("load", guest.NAME, 2, 6, 0, guest.OUT32) == 1, "guests never pick a host file"
    guest.write(guest.NAME, struct.pack("<2I", base, len(model)))
    assert guest.call("load", guest.NAME, 1, 6, 0, guest.OUT32) == 0, "the same bytes without mmproj load"
