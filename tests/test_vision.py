"""Images reach the model: the project's tiny vision model (random CLIP projector + text model) through the host.

A different image changes the greedy answer, the same image reproduces it, the image's tokens are
counted in ``input_tokens``, a repeated image is served from the KV cache, and every bad input
(corrupt or oversized image, a foreign projector, no projector) is an invalid argument, not a crash.
"""

from __future__ import annotations

import base64
import pathlib
import struct
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.core.images import MAX_IMAGE_PIXELS, place_image, split_inline_images
from wasinn_host.core.preload import Preload
from wasinn_host.testing.vision_models import IMAGE_TOKENS, png_bytes, solid_png, write_vision_model

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


def tag(image: bytes, mime: str = "png") -> str:
    return f'<img src="data:image/{mime};base64,{base64.b64encode(image).decode()}">'


def answer(nn: WasiNN, prompt: str, name: str = "v") -> tuple[str, dict[str, int]]:
    with nn.session(name, GREEDY) as session:
        text = session.complete(prompt)
        return text, {k: v for k, v in session.metadata.items() if isinstance(v, int)}


def test_a_different_image_changes_the_answer_and_the_same_image_reproduces_it(vision_nn: WasiNN) -> None:
    red = answer(vision_nn, f"ab {tag(RED)} cd")[0]
    blue = answer(vision_nn, f"ab {tag(BLUE)} cd")[0]
    green = answer(vision_nn, f"ab {tag(GREEN)} cd")[0]
    assert len({red, blue, green}) == 3, "the pixels reach the model"
    assert answer(vision_nn, f"ab {tag(RED)} cd")[0] == red
    assert answer(vision_nn, "ab  cd")[0] not in (red, blue, green), "no image: yet another answer"


def test_image_tokens_are_counted_in_input_tokens(vision_nn: WasiNN) -> None:
    without = answer(vision_nn, "ab  cd")[1]["input_tokens"]
    with_one = answer(vision_nn, f"ab {tag(RED)} cd")[1]["input_tokens"]
    with_two = answer(vision_nn, f"ab {tag(RED)} c{tag(BLUE)}d")[1]["input_tokens"]
    assert with_one == without + IMAGE_TOKENS
    assert with_two == without + 2 * IMAGE_TOKENS


def test_the_same_image_in_the_next_turn_comes_from_the_kv_cache(vision_nn: WasiNN) -> None:
    first = f"ab {tag(RED)} cd"
    with vision_nn.session("v", GREEDY) as session:
        reply = session.complete(first)
        n_first = session.metadata["input_tokens"]
        second = first + reply + " ef"
        again = session.complete(second)
        assert session.metadata["reused_tokens"] >= n_first, "prompt and image are not decoded again"
    assert answer(vision_nn, second)[0] == again, "greedy output identical to a fresh decode"
    with vision_nn.session("v", GREEDY) as session:
        session.complete(first)
        session.complete(f"ab {tag(BLUE)} cd")
        assert session.metadata["reused_tokens"] < 1 + IMAGE_TOKENS, "a different image is decoded again"


def test_jpeg_magic_with_bad_data_gif_and_text_are_refused(vision_nn: WasiNN) -> None:
    corrupt_png = RED[:40] + b"\x00" * 30
    with vision_nn.session("v", GREEDY) as session:
        for image in (corrupt_png, b"\xff\xd8\xff\xe0 no frame", b"plain text, not an image"):
            with pytest.raises(WasiNNError) as err:
                session.complete(f"ab {tag(image)} cd")
            assert err.value.kind is ErrorKind.INVALID_ARGUMENT
        assert session.complete(f"ab {tag(RED)} cd"), "the context still works after refusals"


def test_an_image_too_large_is_refused_from_its_header() -> None:
    huge = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", 50000, 50000) + b"\x08\x02"
    from wasinn_host.core.images import check_image

    with pytest.raises(WasiNNError, match=f"accepted: 1 to {MAX_IMAGE_PIXELS} pixels"):
        check_image(huge)
    check_image(png_bytes(8, 8, [1, 2, 3] * 64))


def test_an_image_must_be_followed_by_text(vision_nn: WasiNN) -> None:
    with vision_nn.session("v", GREEDY) as session, pytest.raises(WasiNNError, match="followed by text"):
        session.complete(f"ab {tag(RED)}")


def test_the_guests_mmproj_key_may_only_name_the_configured_projector(
    vision_nn: WasiNN, vision_files: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path
) -> None:
    projector = vision_files[1]
    for same in (str(projector), projector.name):
        with vision_nn.session("v", {**GREEDY, "mmproj": same}) as session:
            assert session.complete(f"ab {tag(RED)} cd") == answer(vision_nn, f"ab {tag(RED)} cd")[0]
    other = tmp_path / "other.gguf"
    other.write_bytes(projector.read_bytes())
    for name in ("v", "t"):
        with pytest.raises(WasiNNError) as err:
            vision_nn.session(name, {"mmproj": str(other)})
        assert err.value.kind is ErrorKind.INVALID_ARGUMENT


def test_a_model_without_projector_keeps_img_tags_as_text_and_refuses_the_image_key(vision_nn: WasiNN) -> None:
    text, meta = answer(vision_nn, f"ab {tag(RED)} cd", name="t")
    assert meta["input_tokens"] > 100, "the tag is ordinary text there"
    with vision_nn.session("t", {**GREEDY, "image": "/photo.png"}) as session, pytest.raises(WasiNNError) as err:
        session.complete("ab cd")
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT and "no multimodal projector" in err.value.message


def test_inline_tags_and_image_key_placement() -> None:
    text, images = split_inline_images(b"x " + tag(RED).encode() + b" y " + tag(BLUE, "jpeg").encode(), b"<M>")
    assert (text, images) == (b"x <M> y <M>", [RED, BLUE])
    assert place_image(b"a <M> b", [RED], BLUE, b"<M>") == (b"<M>a <M> b", [BLUE, RED]), "no <image>: before the text"
    assert place_image(b"a <M> b <image> c", [RED], BLUE, b"<M>") == (b"a <M> b <M> c", [RED, BLUE])
    with pytest.raises(WasiNNError, match="not valid base64"):
        split_inline_images(b'<img src="data:image/png;base64,abcde">', b"<M>")
