"""Generation controls: every sampling, stop and output key changes the output as it should.

``succ`` is the deterministic successor model (a -> b -> ... -> z -> EOS, digits cycle);
``noisy`` is the same table with a logit gap of 1, so sampling at temp 1 is really random.
"""

from __future__ import annotations

import json
import re

import pytest

from wasinn_host import Errno, WasiNN
from wasinn_host.testing.abi_guest import AbiGuest
from wasinn_host.testing.gguf_models import char_token_id, successor_text

ALPHABET = "bcdefghijklmnopqrstuvwxyz"


@pytest.fixture
def guest(nn: WasiNN) -> AbiGuest:
    return AbiGuest.create(nn)


def generate(
    guest: AbiGuest, prompt: str, config: dict | None = None, model: str = "succ", load_config: str | None = None
) -> tuple[int, str, dict]:
    rc, graph = guest.load_by_name(model, load_config)
    assert rc == 0
    rc, text = guest.generate(graph, prompt, json.dumps(config) if config is not None else None)
    ctx = guest.init(graph)[1] - 1  # the context generate() used
    meta = json.loads(guest.get_output(ctx, 1)[1])
    return rc, text, meta


def sample(guest: AbiGuest, **config: object) -> str:
    base = {"temp": 1.0, "top-k": 0, "top-p": 1.0, "min-p": 0.0, "n-predict": 24}
    return generate(guest, "a", {**base, **config}, model="noisy")[1]


def test_seed_reproduces_and_another_seed_differs(guest: AbiGuest) -> None:
    first = sample(guest, seed=42)
    assert sample(guest, seed=42) == first
    assert sample(guest, seed=43) != first
    assert first != ALPHABET[:24], "temp 1 on the noisy model must not look greedy"


def test_greedy_equivalents(guest: AbiGuest) -> None:
    greedy = generate(guest, "a", {"temp": 0, "n-predict": 24}, model="noisy")[1]
    assert greedy == ALPHABET[:24]
    assert sample(guest, seed=1, **{"top-k": 1}) == greedy
    assert sample(guest, seed=2, **{"top-p": 0.0001}) == greedy
    assert sample(guest, seed=3, **{"min-p": 1.0}) == greedy
    assert sample(guest, seed=4, temp=0.0) == greedy


def test_truncation_keys_change_random_output(guest: AbiGuest) -> None:
    plain = sample(guest, seed=7)
    for key, value in (
        ("top-k", 5),
        ("typ-p", 0.2),
        ("xtc-probability", 1.0),
        ("dynatemp-range", 0.9),
        ("mirostat", 2),
        ("mirostat", 1),
        ("temp", 0.3),
        ("min-keep", 3),
    ):
        config: dict[str, object] = {"seed": 7, key: value}
        if key == "xtc-probability":
            config["xtc-threshold"] = 0.001
        if key == "min-keep":
            config["top-k"] = 1
        out = sample(guest, **config)
        assert out != plain, f"{key}={value} did not change the sampled text"
        assert sample(guest, **config) == out, f"{key}={value} is not reproducible with a fixed seed"
    # a low mirostat target entropy makes the most likely token dominate
    assert sample(guest, seed=9, mirostat=2, **{"mirostat-ent": 0.01}) == ALPHABET[:24]


def test_penalties_and_dry_break_the_digit_cycle(guest: AbiGuest) -> None:
    cycle = successor_text("0", 30)
    assert generate(guest, "0", {"temp": 0, "n-predict": 30})[1] == cycle
    for config in (
        {"presence-penalty": 25.0},
        {"frequency-penalty": 25.0},
        {"repeat-penalty": 2.0, "logit-bias": {str(char_token_id("x")): 15}},
        {"dry-multiplier": 50.0, "dry-allowed-length": 2, "dry-base": 2.0},
    ):
        out = generate(guest, "0", {"temp": 0, "n-predict": 30, **config})[1]
        assert out[:9] == cycle[:9], config  # nothing repeats before the first full cycle
        assert out != cycle, f"{config} did not penalise the repetition"
    # last-n-penalty 0 turns the repetition penalty off
    off = generate(guest, "0", {"temp": 0, "n-predict": 30, "presence-penalty": 25.0, "last-n-penalty": 0})[1]
    assert off == cycle


def test_logit_bias(guest: AbiGuest) -> None:
    q = char_token_id("q")
    assert generate(guest, "a", {"temp": 0, "n-predict": 4, "logit-bias": {str(q): 30}})[1] == "qqqq"
    assert generate(guest, "a", {"temp": 0, "n-predict": 3, "logit-bias": [[char_token_id("b"), False]]})[1] != "bcd"
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    assert guest.set_input(ctx, 1, json.dumps({"logit-bias": {"99999": 1}})) == Errno.INVALID_ARGUMENT


def test_grammar_forces_its_language(guest: AbiGuest) -> None:
    assert generate(guest, "a", {"temp": 0, "grammar": 'root ::= "hello"'})[1] == "hello</s>"
    rc, text, _ = generate(guest, "1", {"temp": 0, "grammar": "root ::= [0-9]+", "n-predict": 6})
    assert (rc, text) == (0, "234567")
    # after "a" the likely "b" is not allowed: the first digit is forced, then EOS may end it
    rc, text, _ = generate(guest, "a", {"temp": 0, "grammar": "root ::= [0-9]+", "n-predict": 6})
    assert rc == 0 and re.fullmatch(r"[0-9]+(</s>)?", text), text
    assert generate(guest, "a", {"temp": 0, "grammar": "", "n-predict": 3})[1] == "bcd", "empty = none"


def test_json_schema(guest: AbiGuest) -> None:
    schema = json.dumps({"type": "integer"})
    rc, text, _ = generate(guest, "a", {"temp": 0, "json-schema": schema, "n-predict": 40})
    assert rc == 0 and re.fullmatch(r"-?[0-9]+ ?(</s>)?", text), text


def test_invalid_grammar_and_schema(guest: AbiGuest, caplog: pytest.LogCaptureFixture) -> None:
    assert guest.load_by_name("succ", json.dumps({"grammar": "root ::= ("}))[0] == Errno.INVALID_ARGUMENT
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    with caplog.at_level("WARNING", logger="wasinn_host"):
        assert guest.set_input(ctx, 1, json.dumps({"grammar": "root ::= [0-9"})) == Errno.INVALID_ARGUMENT
    message = caplog.records[-1].getMessage()
    assert "invalid grammar" in message and "parse" in message.lower(), message
    assert guest.set_input(ctx, 1, json.dumps({"json-schema": "{not json"})) == Errno.INVALID_ARGUMENT
    assert guest.set_input(ctx, 1, json.dumps({"json-schema": "[1, 2]"})) == Errno.INVALID_ARGUMENT


def test_stop_strings_cut_the_text(guest: AbiGuest) -> None:
    rc, text, meta = generate(guest, "a", {"stop": ["xyz", "fgh"]})
    assert (rc, text, meta["stop_reason"]) == (0, "bcde", "stop")
    assert generate(guest, "a", {"stop": ["nothing"]})[1] == ALPHABET + "</s>"
    # the nested form of the original wasi_nn_backend design
    rc, text, meta = generate(guest, "a", {"stopping": {"stop": ["e"], "max_tokens": 10}})
    assert (text, meta["stop_reason"]) == ("bcd", "stop")
    assert generate(guest, "a", {"stopping": {"max_tokens": 2}})[1] == "bc"


def test_max_time_stops_a_long_generation(guest: AbiGuest) -> None:
    rc, text, meta = generate(guest, "7", {"max-time-ms": 30}, load_config='{"ctx-size": 8192}')
    assert rc == 0 and meta["stop_reason"] == "max-time"
    assert 0 < len(text) < 8000


def test_ignore_eos_runs_past_eos(guest: AbiGuest) -> None:
    rc, text, meta = generate(guest, "x", {"ignore-eos": True, "n-predict": 6})
    assert (rc, text, meta["output_tokens"]) == (0, "yz</s></s></s></s>", 6)


def test_metadata_keeps_wasmedge_keys_first(guest: AbiGuest) -> None:
    rc, _, meta = generate(guest, "v", {})
    assert list(meta)[:4] == ["input_tokens", "output_tokens", "llama_build_number", "llama_commit"]
    assert meta["input_tokens"] == 2 and meta["output_tokens"] == 5
    assert meta["stop_reason"] == "eos"
    assert meta["prompt_ms"] >= 0 and meta["generation_ms"] >= 0 and meta["tokens_per_second"] >= 0


def test_n_probs(guest: AbiGuest) -> None:
    rc, text, meta = generate(guest, "a", {"n-probs": 3, "n-predict": 2, "temp": 0})
    assert text == "bc"
    assert [p["piece"] for p in meta["probs"]] == ["b", "c"]
    for entry in meta["probs"]:
        assert len(entry["top"]) == 3
        assert entry["top"][0]["id"] == entry["id"] and entry["top"][0]["p"] > 0.999
    rc, _, meta = generate(guest, "a", {"n-probs": 2, "n-predict": 1, "temp": 0}, model="noisy")
    top = meta["probs"][0]["top"]
    assert top[0]["piece"] == "b" and 0.0 < top[1]["p"] < top[0]["p"] < 0.1


def test_flat_underscore_keys(guest: AbiGuest) -> None:
    assert generate(guest, "a", {"n_predict": 3, "temp": 0.0})[1] == "bcd"
    assert generate(guest, "a", {"sampling": {"temperature": 0}, "stopping": {"max_tokens": 4}})[1] == "bcde"
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    assert guest.set_input(ctx, 1, json.dumps({"sampling": 5})) == Errno.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "config",
    [
        {"temp": "hot"},
        {"top-p": 2},
        {"min-p": -0.1},
        {"typ-p": 1.5},
        {"mirostat": 3},
        {"top-k": -1},
        {"dry-base": 0.5},
        {"seed": -1},
        {"n-probs": 1000},
        {"stop": "x"},
        {"stop": [1]},
        {"max-time-ms": -5},
        {"logit-bias": {"a": 1}},
        {"chat-template": 3},
        {"priority": 1000},
    ],
)
def test_bad_values_are_refused(guest: AbiGuest, config: dict, caplog: pytest.LogCaptureFixture) -> None:
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    with caplog.at_level("WARNING", logger="wasinn_host"):
        assert guest.set_input(ctx, 1, json.dumps(config)) == Errno.INVALID_ARGUMENT
    (record,) = caplog.records
    assert next(iter(config)) in record.getMessage()


def test_streaming_pieces_are_whole_utf8_characters(guest: AbiGuest) -> None:
    """ "é" is two byte-fallback tokens: the first step shows nothing, the second the whole character;
    get_output(0) has the raw bytes all along."""
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    assert guest.set_input(ctx, 1, json.dumps({"grammar": 'root ::= "é!"', "temp": 0})) == 0
    assert guest.set_input(ctx, 0, "a") == 0
    pieces, texts = [], []
    while guest.call("compute_single", ctx) == 0:
        pieces.append(guest.get_output(ctx, single=True)[1])
        texts.append(guest.get_output(ctx)[1])
    assert pieces == [b"", "é".encode(), b"!"]
    assert texts == [b"\xc3", "é".encode(), "é!".encode()]


def test_host_chat_template(guest: AbiGuest) -> None:
    messages = json.dumps([{"role": "system", "content": "ignored"}, {"role": "user", "content": "s"}])
    template = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
    rc, text, _ = generate(guest, messages, {"chat-template": template})
    assert (rc, text) == (0, successor_text("s") + "</s>")
    ctx = guest.init(guest.load_by_name("succ")[1])[1]
    assert guest.set_input(ctx, 1, json.dumps({"chat-template": True})) == 0
    assert guest.set_input(ctx, 0, messages) == Errno.INVALID_ARGUMENT, "the successor model has no template"
    assert guest.set_input(ctx, 1, json.dumps({"chat-template": template})) == 0
    assert guest.set_input(ctx, 0, "not json") == Errno.INVALID_ARGUMENT


def test_embeddings(guest: AbiGuest) -> None:
    graph = guest.load_by_name("succ", '{"embedding": true}')[1]
    ctx = guest.init(graph)[1]
    vectors = []
    for prompt in ("a", "b", "b"):
        assert guest.set_input(ctx, 0, prompt) == 0
        assert guest.call("compute", ctx) == 0
        raw = guest.get_output(ctx, size=0x6000)[1].decode()
        assert raw.startswith('{"n_embedding": 384, "embedding": [')
        doc = json.loads(raw)
        vectors.append(doc["embedding"])
    a, b, b2 = vectors
    assert abs(sum(v * v for v in a) - 1.0) < 1e-6, "L2-normalised by default"
    assert a != b and b == b2
    assert guest.set_input(ctx, 1, '{"embd-normalize": 1}') == 0
    assert guest.set_input(ctx, 0, "a") == 0 and guest.call("compute", ctx) == 0
    l1 = json.loads(guest.get_output(ctx, size=0x6000)[1])["embedding"]
    assert abs(sum(abs(v) for v in l1) - 1.0) < 1e-6
    assert guest.get_output(ctx, 1)[1].startswith(b'{"input_tokens": 2, "output_tokens": 0,')


def test_python_session_stream_equals_complete(nn: WasiNN) -> None:
    with nn.session("succ", {"temp": 0}) as session:
        full = session.complete("k")
        assert full == successor_text("k") + "</s>"
        pieces = list(session.stream("k"))
        assert b"".join(pieces).decode() == successor_text("k")
        assert session.metadata["input_tokens"] == 2
        assert list(session.stream("3", max_tokens=5)) == [b"4", b"5", b"6", b"7", b"8"]


def test_python_session_stream_keeps_n_predict(nn: WasiNN) -> None:
    """stream() stops where complete() does: at the session's n-predict (and at max_tokens if smaller)."""
    with nn.session("succ", {"temp": 0, "n-predict": 4}) as session:
        assert session.complete("a") == "bcde"
        assert list(session.stream("a")) == [b"b", b"c", b"d", b"e"]
        assert list(session.stream("a", max_tokens=2)) == [b"b", b"c"]
        session.configure({"n-predict": 6})
        assert b"".join(session.stream("0")) == successor_text("0", 6).encode()
        session.configure({"temp": 0})  # a config without n-predict keeps the session's
        assert b"".join(session.stream("0")) == successor_text("0", 6).encode()


def test_secondary_sampling_keys(guest: AbiGuest) -> None:
    plain = sample(guest, seed=11)
    # dynamic temperature depends on the entropy: give a few tokens a lead so it is neither 0 nor maximal
    lead = {"logit-bias": {str(char_token_id(c)): 4.0 for c in "abcdefgh"}, "dynatemp-range": 0.9}
    dyn = sample(guest, seed=11, **lead, **{"dynatemp-exponent": 1.0})
    assert sample(guest, seed=11, **lead, **{"dynatemp-exponent": 4.0}) != dyn
    miro = sample(guest, seed=11, mirostat=2, **{"mirostat-eta": 0.1})
    assert sample(guest, seed=11, mirostat=2, **{"mirostat-eta": 1.0}) != miro
    xtc = {"xtc-probability": 1.0, "seed": 11}
    assert sample(guest, **xtc, **{"xtc-threshold": 0.9}) == plain, "no candidate above the threshold: no effect"
    assert sample(guest, **xtc, **{"xtc-threshold": 0.001}) != plain
    cycle = successor_text("0", 30)
    dry = {"temp": 0, "n-predict": 30, "dry-multiplier": 50.0, "dry-allowed-length": 2}
    penalised = generate(guest, "0", dry)[1]
    assert penalised != cycle
    assert generate(guest, "0", {**dry, "dry-last-n": 0})[1] == cycle, "dry-last-n 0 looks at nothing"
    assert generate(guest, "0", {**dry, "dry-allowed-length": 40})[1] == cycle, "repeats shorter than allowed"
    assert generate(guest, "0", {**dry, "dry-sequence-breakers": [str(d) for d in range(10)]})[1] == cycle
    assert generate(guest, "0", {**dry, "dry-base": 1.01, "dry-multiplier": 0.5})[1] == cycle, "a weak penalty"
