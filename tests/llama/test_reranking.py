"""``reranking``: the project's tiny reranker (a Qwen3 decoder with a ``cls.output`` head) scores documents
through the host as llama.cpp scores them when llama-cpp-python drives it directly.

The reference below builds each sequence itself (llama-server's ``format_prompt_rerank``: BOS query EOS
SEP document EOS, or the model's ``rerank`` template) and decodes it alone in a context shaped like the
host's (one sequence of ``CTX`` cells, ``n_ubatch`` = ``n_batch``, the same threads): the same calls, so
the same scores, bit for bit.  Scores reach a WasmEdge-style guest through ``wasinn run`` (the embedding
JSON) and Python through ``Session.rerank``.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator

import pytest

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.core.errors import ErrorKind, WasiNNError
from wasinn_host.llama.bindings import llama_cpp
from wasinn_host.llama.log import init_backend
from wasinn_host.testing.gguf_models import BOS_ID, EOS_ID, write_successor_model
from wasinn_host.testing.guest_runs import wasinn_cli
from wasinn_host.testing.reranker_model import LABELS, SEP_ID, write_reranker_model

CTX = 512
LOAD = {"reranking": True, "ctx-size": CTX, "n-parallel": 1, "threads": 2}
QUERY = "what is a cat"
DOCUMENTS = ["a cat is an animal", "paris is in france", "cats", "Ünïcode ✓ too"]
TEMPLATE = "Query: {query}\nDocument: {document}</s>"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, pathlib.Path]:
    folder = tmp_path_factory.mktemp("reranker")
    return {
        "rr": write_reranker_model(folder / "rr.gguf"),
        "rrt": write_reranker_model(folder / "rrt.gguf", rerank_template=TEMPLATE),
    }


@pytest.fixture(scope="module")
def nn(models: dict[str, pathlib.Path]) -> Iterator[WasiNN]:
    registry = ModelRegistry([f"{name}:GGML:AUTO:{path}" for name, path in models.items()])
    yield WasiNN(registry=registry)
    registry.close()


class Reference:
    """The reranker driven by llama-cpp-python alone: one sequence per context, rank pooling."""

    def __init__(self, path: pathlib.Path) -> None:
        init_backend()
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)

    def tokens(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        data = text.encode()
        buf = (llama_cpp.llama_token * (len(data) + 8))()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_special, parse_special)
        return list(buf[:n])

    def pair(self, query: str, document: str) -> list[int]:
        return [BOS_ID, *self.tokens(query), EOS_ID, SEP_ID, *self.tokens(document), EOS_ID]

    def scores(self, tokens: list[int]) -> list[float]:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = CTX, 2048, 2048, 1
        params.n_threads = params.n_threads_batch = 2
        params.kv_unified, params.embeddings = False, True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_RANK
        ctx = llama_cpp.llama_init_from_model(self.model, params)
        batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
        try:
            batch.n_tokens = len(tokens)
            for i, token in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, i == len(tokens) - 1
                batch.seq_id[i][0] = 0
            assert llama_cpp.llama_decode(ctx, batch) == 0
            out = llama_cpp.llama_get_embeddings_seq(ctx, 0)
            return [float(out[i]) for i in range(llama_cpp.llama_model_n_cls_out(self.model))]
        finally:
            llama_cpp.llama_batch_free(batch)
            llama_cpp.llama_free(ctx)

    def close(self) -> None:
        llama_cpp.llama_model_free(self.model)


@pytest.fixture(scope="module")
def reference(models: dict[str, pathlib.Path]) -> Iterator[Reference]:
    ref = Reference(models["rr"])
    yield ref
    ref.close()


def test_scores_are_llama_cpps_rank_pooling(nn: WasiNN, reference: Reference) -> None:
    with nn.session("rr", LOAD) as session:
        scores = session.rerank(QUERY, DOCUMENTS)
        assert session.metadata["input_tokens"] == sum(len(reference.pair(QUERY, d)) for d in DOCUMENTS)
    expected = [reference.scores(reference.pair(QUERY, d))[0] for d in DOCUMENTS]
    # the host scores the documents in one batch, the reference one per context: other matrix shapes,
    # which another CPU's kernels may round differently (docs/development/numerics.md)
    assert scores == pytest.approx(expected, rel=1e-5, abs=1e-7)
    assert len(set(scores)) == len(DOCUMENTS) and all(0.0 < s < 1.0 for s in scores), "P(yes) of each document"
    assert llama_cpp.llama_model_n_cls_out(reference.model) == len(LABELS)


def test_a_wasmedge_style_guest_gets_scores_through_wasinn_run(
    models: dict[str, pathlib.Path], reference: Reference
) -> None:
    prompt = json.dumps({"query": QUERY, "documents": DOCUMENTS[:3], "top_n": 1})
    result = wasinn_cli(
        "--nn-preload",
        f"default:GGML:AUTO:{models['rr']}",
        "--env",
        f"WASINN_CONFIG={json.dumps(LOAD)}",
        "guest_examples/complete.wasm",
        "default",
        prompt,
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert result.stdout.startswith('{"n_embedding": 3, "embedding": [')
    expected = [reference.scores(reference.pair(QUERY, d))[0] for d in DOCUMENTS[:3]]
    assert output["embedding"] == pytest.approx(expected, rel=1e-5, abs=1e-7)  # printed with 10 digits


def test_a_prompt_the_guest_formatted_itself_is_one_sequence(nn: WasiNN, reference: Reference) -> None:
    """WasmEdge's plugin scores the prompt it is given: tokenized as any prompt (BOS, EOS added by the
    vocabulary), every class of the head in the output, not normalised."""
    text = "what is a cat</s>[SEP]a cat is an animal"
    with nn.session("rr", {**LOAD, "embd-normalize": 2}) as session:
        vector = session.embed(text)
    assert vector == reference.scores(reference.tokens(text, add_special=True, parse_special=True))
    assert len(vector) == len(LABELS) and abs(sum(vector) - 1.0) < 1e-6, "the head's softmax, not an L2 norm"


def test_the_models_rerank_template_formats_each_pair(nn: WasiNN, models: dict[str, pathlib.Path]) -> None:
    ref = Reference(models["rrt"])
    try:
        expected = [
            ref.scores(ref.tokens(TEMPLATE.replace("{query}", QUERY).replace("{document}", d), parse_special=True))[0]
            for d in DOCUMENTS[:2]
        ]
    finally:
        ref.close()
    with nn.session("rrt", LOAD) as session:
        assert session.rerank(QUERY, DOCUMENTS[:2]) == pytest.approx(expected, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize(
    ("prompt", "needle"),
    [
        ({"query": QUERY, "documents": []}, "non-empty array of strings"),
        ({"query": QUERY, "documents": ["ok", 3]}, "non-empty array of strings"),
        ({"query": QUERY}, "non-empty array of strings"),
        ({"query": ["x"], "texts": ["ok"]}, "'query' must be a string"),
    ],
)
def test_malformed_rerank_requests_are_invalid_arguments(nn: WasiNN, prompt: dict[str, object], needle: str) -> None:
    with nn.session("rr", LOAD) as session, pytest.raises(WasiNNError) as err:
        session.complete(json.dumps(prompt))
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT and needle in str(err.value)


def test_tei_texts_and_a_document_too_long(nn: WasiNN, reference: Reference) -> None:
    with nn.session("rr", LOAD) as session:
        scores = session.rerank(QUERY, DOCUMENTS[:1])
        session.complete(json.dumps({"query": QUERY, "texts": DOCUMENTS[:1]}))
        assert session.embed(json.dumps({"query": QUERY, "texts": DOCUMENTS[:1]})) == scores
    with nn.session("rr", {**LOAD, "batch-size": 64}) as session, pytest.raises(WasiNNError) as err:
        session.rerank(QUERY, ["short", "x" * 80])
    assert err.value.kind is ErrorKind.PROMPT_TOO_LONG and "rerank document 1" in str(err.value)


def test_an_embedding_model_is_no_reranker(nn: WasiNN) -> None:
    """Without ``reranking`` a ``/rerank``-shaped prompt is text, embedded as it is (L2-normalised)."""
    with nn.session("rr", {"embedding": True, "ctx-size": CTX}) as session:
        vector = session.embed(json.dumps({"query": QUERY, "documents": DOCUMENTS}))
    assert len(vector) == 64 and abs(sum(v * v for v in vector) - 1.0) < 1e-6


def test_a_model_without_a_classification_head_cannot_rerank(tmp_path: pathlib.Path) -> None:
    """Rank pooling over a model without ``cls.*`` tensors would score every document 0: refused at load."""
    path = write_successor_model(tmp_path / "plain.gguf")
    registry = ModelRegistry([f"plain:GGML:AUTO:{path}"])
    try:
        nn = WasiNN(registry=registry)
        with pytest.raises(WasiNNError) as err, nn.session("plain", LOAD) as session:
            session.rerank(QUERY, DOCUMENTS)
    finally:
        registry.close()
    assert err.value.kind is ErrorKind.INVALID_ARGUMENT
    assert "no classification head" in str(err.value) and "reranker model" in str(err.value)
