"""Every key WasmEdge's GGML plugin acts on is parsed into the parameter records, as WasmEdge types it;
values llama.cpp (or WasmEdge) refuses are an invalid argument naming the key and what is accepted; none
is warned about as unimplemented any more."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from wasinn_host.core.config import keys
from wasinn_host.core.config.keys import parse_config
from wasinn_host.core.config.params import POOLING_RANK, ContextParams, ModelParams
from wasinn_host.core.errors import ErrorKind, WasiNNError

pytestmark = pytest.mark.fast

IMPLEMENTED_HERE = (
    "reranking",
    "pooling-type",
    "attention-type",
    "rope-scaling-type",
    "rope-freq-base",
    "rope-freq-scale",
    "top-n-sigma",
    "n-prev",
    "cpu-moe",
    "n-cpu-moe",
    "tensor-split",
    "split-mode",
    "no-kv-offload",
    "always-regenerate-image-embd",
)


def model(doc: dict[str, Any]) -> ModelParams:
    return parse_config(json.dumps(doc)).apply_model(ModelParams())


def context(doc: dict[str, Any]) -> ContextParams:
    return parse_config(json.dumps(doc)).apply_context(ContextParams())


def refused(doc: dict[str, Any]) -> str:
    with pytest.raises(WasiNNError) as err:
        parse_config(json.dumps(doc))
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    return str(err.value)


def test_reranking_is_an_embedding_model_with_rank_pooling() -> None:
    params = model({"reranking": True})
    assert (params.reranking, params.embedding, params.pooling_type) == (True, True, POOLING_RANK)
    assert model({"reranking": True, "embedding": False, "pooling-type": 1}).pooling_type == POOLING_RANK
    off = model({"reranking": False})
    assert (off.embedding, off.pooling_type) == (False, -1)
    assert "expected true or false" in refused({"reranking": 1})


def test_pooling_attention_and_rope_keys_reach_the_model_params() -> None:
    params = model(
        {
            "pooling-type": 1,
            "attention-type": 1,
            "rope-scaling-type": 2,
            "rope-freq-base": 20000,
            "rope-freq-scale": 0.25,
            "yarn-ext-factor": 1.0,
            "yarn-attn-factor": 1.5,
            "yarn-beta-fast": 16,
            "yarn-beta-slow": 2,
            "yarn-orig-ctx": 64,
        }
    )
    assert (params.pooling_type, params.attention_type, params.rope_scaling_type) == (1, 1, 2)
    assert (params.rope_freq_base, params.rope_freq_scale) == (20000.0, 0.25)
    assert (params.yarn_ext_factor, params.yarn_attn_factor, params.yarn_beta_fast, params.yarn_beta_slow) == (
        1.0,
        1.5,
        16.0,
        2.0,
    )
    assert params.yarn_orig_ctx == 64
    assert ModelParams().yarn_attn_factor is None, "unset: llama.cpp's own default"


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ({"pooling-type": 5}, "-1 (model) to 4"),
        ({"pooling-type": "mean"}, "expected an integer"),
        ({"attention-type": 2}, "0 causal, 1 non-causal"),
        ({"rope-scaling-type": 4}, "1 linear, 2 yarn"),
        ({"rope-freq-base": -1}, ">= 0.0"),
        ({"rope-freq-scale": "2"}, "expected a number"),
        ({"yarn-orig-ctx": -1}, "0 (the model's)"),
        ({"n-cpu-moe": -1}, "0 to 4096"),
        ({"cpu-moe": "yes"}, "expected true or false"),
        ({"split-mode": "diagonal"}, "none, layer or row"),
        ({"tensor-split": "3,x"}, "comma-separated proportions"),
        ({"tensor-split": "3,-1"}, "comma-separated proportions"),
        ({"tensor-split": [3, 2]}, "expected a string"),
        ({"no-kv-offload": 1}, "expected true or false"),
        ({"n-prev": -1}, "0 to 1048576"),
        ({"top-n-sigma": "1"}, "expected a number"),
        ({"always-regenerate-image-embd": "true"}, "expected true or false"),
    ],
)
def test_bad_values_are_refused_naming_the_key(doc: dict[str, Any], needle: str) -> None:
    message = refused(doc)
    assert next(iter(doc)) in message and needle in message


def test_placement_keys_reach_the_model_params() -> None:
    params = model({"cpu-moe": True, "n-cpu-moe": 3, "tensor-split": "3,2", "split-mode": "row", "no-kv-offload": True})
    assert (params.cpu_moe, params.n_cpu_moe, params.tensor_split) == (True, 3, (3.0, 2.0))
    assert (params.split_mode, params.no_kv_offload) == ("row", True)
    assert model({"tensor-split": "1"}).tensor_split == (1.0,)
    assert ModelParams().split_mode == "layer", "WasmEdge's (llama.cpp's) default"


def test_sampling_and_context_keys_reach_the_context_params() -> None:
    params = context({"top-n-sigma": 1.5, "n-prev": 32, "always-regenerate-image-embd": True})
    assert (params.sampling.top_n_sigma, params.sampling.n_prev) == (1.5, 32)
    assert params.options.always_regenerate_image_embd is True
    assert (ContextParams().sampling.top_n_sigma, ContextParams().sampling.n_prev) == (-1.0, 64)


def test_a_json_schema_and_a_grammar_replace_each_other() -> None:
    """The core keeps a ``json-schema`` as JSON text (the backend turns it into its grammar): of the two keys,
    the one a config sets last is in force (a schema wins within one config), and an empty schema leaves an
    earlier one in force, as when the core converted it into ``grammar``."""

    def applied(*docs: dict[str, Any]) -> tuple[str, str]:
        params = ContextParams()
        for doc in docs:
            params = parse_config(json.dumps(doc)).apply_context(params)
        return params.sampling.grammar, params.sampling.json_schema

    schema, gbnf = '{"type": "integer"}', "root ::= [0-9]+"
    assert applied({"json-schema": schema}) == ("", schema)
    assert applied({"grammar": gbnf, "json-schema": schema}) == ("", schema)
    assert applied({"grammar": gbnf}, {"json-schema": schema}) == ("", schema)
    assert applied({"json-schema": schema}, {"grammar": gbnf}) == (gbnf, "")
    assert applied({"json-schema": schema}, {"json-schema": ""}) == ("", schema)
    assert applied({"json-schema": schema}, {"grammar": ""}) == ("", "")
    assert applied({"grammar": gbnf, "json-schema": ""}) == (gbnf, "")
    assert "not valid JSON" in refused({"json-schema": "{not json"})


def test_no_implemented_key_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    doc = {
        "reranking": False,
        "pooling-type": 0,
        "attention-type": 0,
        "rope-scaling-type": 0,
        "rope-freq-base": 0,
        "rope-freq-scale": 0,
        "top-n-sigma": -1,
        "n-prev": 64,
        "cpu-moe": False,
        "n-cpu-moe": 0,
        "tensor-split": "0",
        "split-mode": "layer",
        "no-kv-offload": False,
        "always-regenerate-image-embd": False,
    }
    assert set(doc) == set(IMPLEMENTED_HERE)
    with caplog.at_level(logging.WARNING, logger="wasinn_host"):
        parse_config(json.dumps(doc))
    assert not caplog.records
    assert set(IMPLEMENTED_HERE) <= set(keys.KEYS) | set(keys.ALIASES)
