"""The KV cache type keys ``type-k``/``type-v`` (and WasmEdge's ``cache-type-k``/``-v``) as the config parser
reads them, the flash-attention rule of a quantized V cache, and the prompt-cache key they change."""

from __future__ import annotations

import pytest

from wasinn_host.core.config.keys import parse_config
from wasinn_host.core.config.kv_types import cache_layout, check_flash_attn
from wasinn_host.core.config.params import ModelParams
from wasinn_host.core.errors import ErrorKind, WasiNNError

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ('{"type-k": "q8_0", "type-v": "q8_0"}', {"type_k": "q8_0", "type_v": "q8_0"}),
        ('{"type-k": "Q4_0"}', {"type_k": "q4_0"}),
        ('{"cache-type-k": "q5_1", "cache-type-v": "iq4_nl"}', {"type_k": "q5_1", "type_v": "iq4_nl"}),
        ('{"cache-type-k": 8, "cache-type-v": 2}', {"type_k": "q8_0", "type_v": "q4_0"}),  # WasmEdge: ggml_type
        ('{"cache_type_v": 1, "type_k": "bf16"}', {"type_k": "bf16", "type_v": "f16"}),
        ('{"model": {"type-v": "f32"}}', {"type_v": "f32"}),
    ],
)
def test_names_and_ggml_type_numbers_are_load_time_keys(config: str, expected: dict[str, str]) -> None:
    parsed = parse_config(config)
    assert dict(parsed.model) == expected
    params = parsed.apply_model(ModelParams())
    assert (params.type_k, params.type_v) == (expected.get("type_k", "f16"), expected.get("type_v", "f16"))


@pytest.mark.parametrize(
    ("config", "shown"),
    [
        ('{"type-k": "q7"}', '"q7" is out of range'),
        ('{"type-v": "q8"}', '"q8" is out of range'),
        ('{"cache-type-k": 99}', '"99" is out of range'),  # no ggml type of a KV cache
        ('{"cache-type-k": 12}', '"12" is out of range'),  # q4_K: a ggml type, not one a KV cache takes
        ('{"type-v": true}', "got boolean true; expected a string"),
        ('{"type-k": ["q8_0"]}', 'got array ["q8_0"]; expected a string'),
    ],
)
def test_a_bad_value_is_an_invalid_argument_naming_what_is_accepted(config: str, shown: str) -> None:
    with pytest.raises(WasiNNError) as raised:
        parse_config(config)
    assert raised.value.kind is ErrorKind.INVALID_ARGUMENT
    assert shown in raised.value.message
    if "out of range" in shown:
        assert "f16, bf16, q8_0, q4_0" in raised.value.message


def test_a_quantized_v_cache_needs_flash_attention() -> None:
    for flash_attn in ("auto", "on", "enabled"):
        check_flash_attn("q8_0", flash_attn)  # llama.cpp turns it on (auto) or has it
    for type_v in ("f16", "f32", "bf16"):
        check_flash_attn(type_v, "off")
    with pytest.raises(WasiNNError) as raised:
        check_flash_attn("q4_0", "disabled")
    assert raised.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "type-v" in raised.value.message and "flash-attn" in raised.value.message


def test_the_prompt_cache_key_changes_with_the_types_only() -> None:
    assert cache_layout(ModelParams()) == "auto"  # entries saved before the keys existed keep their key
    assert cache_layout(ModelParams(flash_attn="on")) == "on"
    assert cache_layout(ModelParams(type_k="q8_0", type_v="q8_0")) == "auto q8_0/q8_0"
    assert cache_layout(ModelParams(type_v="q4_0")) != cache_layout(ModelParams(type_k="q4_0"))
