"""The RPC client's handling of config keys that name the guest's files (``rpc/client_files.py``)."""

from __future__ import annotations

import base64

import orjson
import pytest

from wasinn_host.core.config.keys import parse_config
from wasinn_host.core.images import IMG_TAG
from wasinn_host.rpc.client_files import inline_image, without_client_keys

pytestmark = pytest.mark.fast


def test_image_and_mmproj_are_taken_out_at_the_top_and_in_sections() -> None:
    config = parse_config(
        b'{"image": "/data/a.png", "mmproj": "p.gguf", "n-predict": 4, '
        b'"sampling": {"temp": 0}, "model": {"mmproj": "q"}}'
    )
    sent, image = without_client_keys(config)
    assert image == "/data/a.png"
    assert orjson.loads(sent.source) == {"n-predict": 4, "sampling": {"temp": 0}, "model": {}}
    assert sent.stopping == config.stopping and sent.sampling == config.sampling


def test_a_config_without_file_keys_is_sent_as_written() -> None:
    config = parse_config(b'{ "n_predict" : 4 }')
    assert without_client_keys(config) == (config, None)
    assert without_client_keys(config)[0].source == b'{ "n_predict" : 4 }'
    assert without_client_keys(parse_config(b'{"mmproj": "p"}'))[0].source == b""


def test_the_image_goes_inline_at_the_first_image_marker_else_first() -> None:
    tag = b'<img src="data:image/any;base64,' + base64.b64encode(b"PIXELS") + b'">'
    assert inline_image(b"a <image> b <image>", b"PIXELS") == b"a " + tag + b" b <image>"
    assert inline_image(b"a b", b"PIXELS") == tag + b"a b"
    assert IMG_TAG.fullmatch(tag), "the server's parser reads the tag"
