"""``always-regenerate-image-embd``: an image is encoded and decoded again on every compute (WasmEdge's
per-context key) instead of being kept in the KV cache from the previous one; the answer is the same."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.config.preload import Preload
from wasinn_host.testing.vision_models import IMAGE_TOKENS, img_tag, solid_png, write_vision_model

GREEDY = {"temp": 0, "n-predict": 8}
FIRST = f"ab {img_tag(solid_png(255, 0, 0))} cd"


@pytest.fixture(scope="module")
def vision_nn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WasiNN]:
    text, projector = write_vision_model(pathlib.Path(tmp_path_factory.mktemp("regen")))
    registry = ModelRegistry([Preload("v", text, mmproj=projector)])
    yield WasiNN(registry=registry)
    registry.close()


def two_turns(nn: WasiNN, config: dict[str, object], later: dict[str, object] | None = None) -> tuple[str, int]:
    """The second turn's answer and the prompt tokens it kept from the first."""
    with nn.session("v", {**GREEDY, **config}) as session:
        reply = session.complete(FIRST)
        if later is not None:
            session.configure(later)
        again = session.complete(FIRST + reply + " ef")
        return again, session.metadata["reused_tokens"]


def test_the_image_is_decoded_again_on_every_compute(vision_nn: WasiNN) -> None:
    kept, reused_kept = two_turns(vision_nn, {})
    assert reused_kept > IMAGE_TOKENS, "by default the image comes from the KV cache"
    again, reused = two_turns(vision_nn, {"always-regenerate-image-embd": True})
    assert reused == 1 + len("ab "), "only the text before the image is kept"
    assert again == kept, "the same answer"


def test_the_key_is_per_context_metadata(vision_nn: WasiNN) -> None:
    _, reused = two_turns(vision_nn, {}, later={"always-regenerate-image-embd": True})
    assert reused == 1 + len("ab ")
    _, reused = two_turns(
        vision_nn, {"always-regenerate-image-embd": True}, later={"always-regenerate-image-embd": False}
    )
    assert reused > IMAGE_TOKENS
