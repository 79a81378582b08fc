"""What the ABI fuzzer passes to the imports: pointers and lengths (edge cases around guest memory),
configuration JSON (valid, wrong types, out of range, not JSON), prompts and model bytes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from wasinn_host.testing.fuzz.abi_env import HUGE, MEM, MODEL_PROFILES, U32
from wasinn_host.testing.gguf_models import SUCCESSOR_VOCAB_SIZE

# -- strategies -----------------------------------------------------------------------------------


def weighted(*pairs: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """Pick a strategy with the given integer weights."""
    table = [s for w, s in pairs for _ in range(w)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


u32s = st.integers(0, U32)


def ptr_for(n: int, wild: bool = True) -> st.SearchStrategy[int]:
    """A guest pointer meant for ``n`` bytes: inside memory, or (``wild``) often at the edges."""
    n = min(n, MEM)
    inside = st.integers(0, MEM - n)
    if not wild:
        return inside
    edges = sorted({p for p in (0, 1, MEM - n, MEM - n + 1, MEM - n - 1, MEM - 1, *HUGE) if 0 <= p <= U32})
    return weighted((6, inside), (3, st.sampled_from(edges)), (1, u32s))


def length_for(n: int, wild: bool = True) -> st.SearchStrategy[int]:
    """A length argument for ``n`` bytes of content: exact, or (``wild``) sometimes off or absurd."""
    if not wild:
        return st.just(n)
    edges = sorted({x for x in (0, n - 1, n + 1, MEM, 0x8000_0000, U32) if x >= 0})
    return weighted((8, st.just(n)), (3, st.sampled_from(edges)), (1, u32s))


special_handles = st.sampled_from([0, 1, 2, 3, 4, 5, 7, 0x7FFF_FFFF, 0x8000_0000, U32])
random_handles = st.one_of(special_handles, u32s)
indices = weighted((8, st.just(0)), (6, st.just(1)), (2, st.sampled_from([2, 3, 0x101, U32])), (1, u32s))

PROMPT_CHARS = "abcdefghijklmnopqrstuvwxyzABCXYZ .,!?-"
prompts = weighted(
    (10, st.text(PROMPT_CHARS, max_size=12).map(str.encode)),
    (2, st.sampled_from([b"a", b"x", b"Z", b"", b"0", b"7", b"12 9", b"abc 4"])),
    (1, st.sampled_from([b"<s>", b"</s>", b"<unk>", b"a</s>b", "\u00e9\u2713\U0001f600".encode()])),
    (2, st.binary(max_size=48)),
    (1, st.sampled_from([b"ab " * 200, b"q" * 530, b"7" * 40])),
    (1, st.just(b'[{"role": "user", "content": "hi"}]')),
)


def _finite(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False)


# per-context keys with values the host accepts: (key, strategy)
def _context_items() -> list[tuple[str, st.SearchStrategy[Any]]]:
    # ids past the vocabulary are answered with 1 (they used to hang compute: fixed)
    vocab_ids = weighted(
        (4, st.integers(0, SUCCESSOR_VOCAB_SIZE - 1)),
        (1, st.sampled_from([SUCCESSOR_VOCAB_SIZE, 100000, 2**31 - 1, 2**31, 2**40])),
    )
    return [
        ("n-predict", weighted((12, st.integers(0, 8)), (1, st.sampled_from([-1, 40, 2**40])))),
        ("max-tokens", st.integers(0, 8)),
        ("temp", weighted((3, _finite(0.0, 1.0)), (1, st.sampled_from([0, 1, -0.5])))),
        ("temperature", _finite(0.0, 1.0)),
        ("top-k", st.integers(0, 50)),
        ("top-p", _finite(0.0, 1.0)),
        ("min-p", _finite(0.0, 1.0)),
        ("typ-p", _finite(0.0, 1.0)),
        ("seed", st.integers(0, U32)),
        ("repeat-penalty", _finite(0.0, 2.0)),
        ("presence-penalty", _finite(0.0, 1.0)),
        ("frequency-penalty", _finite(0.0, 1.0)),
        ("last-n-penalty", st.integers(-1, 64)),
        ("mirostat", st.integers(0, 2)),
        ("dry-multiplier", _finite(0.0, 1.0)),
        ("xtc-probability", _finite(0.0, 1.0)),
        ("dynatemp-range", _finite(0.0, 1.0)),
        ("n-probs", st.integers(0, 3)),
        ("logit-bias", st.dictionaries(vocab_ids.map(str), _finite(-100.0, 100.0), max_size=3)),
        ("reverse-prompt", st.sampled_from(["", "c", "xyz", "\u2713"])),
        ("stop", st.lists(st.sampled_from(["", "d", "mn", "</s>"]), max_size=3)),
        ("max-time-ms", st.integers(0, 200)),
        ("ignore-eos", st.booleans()),
        ("stream-stdout", weighted((6, st.just(False)), (1, st.just(True)))),
        ("grammar", st.sampled_from(["", "root ::= [a-z]*", 'root ::= "b" [c-e]+'])),
        ("json-schema", st.sampled_from(["", '{"type": "string"}', '{"type": "integer"}'])),
        ("chat-template", weighted((4, st.just(False)), (1, st.sampled_from([True, "{{ messages[0].content }}"])))),
        ("cache-prompt", st.booleans()),
        ("n-keep", st.integers(-1, 8)),
        ("priority", st.integers(-100, 100)),
        ("embd-normalize", st.integers(-1, 3)),
        ("enable-log", st.just(False)),  # true lowers the process-wide log level for good
        ("llama3", st.booleans()),  # unknown keys are ignored
        ("include_usage", st.booleans()),
    ]


# known keys with a value of the wrong JSON type or out of range: the host answers 1
BAD_VALUES: tuple[dict[str, Any], ...] = (
    {"n-predict": "5"},
    {"n-predict": 1.5},
    {"ctx-size": 1024.0},
    {"ctx-size": "big"},
    {"temp": True},
    {"temp": "hot"},
    {"ignore-eos": 1},
    {"stream-stdout": "yes"},
    {"reverse-prompt": 7},
    {"stop": [1, 2]},
    {"stop": "x"},
    {"top-p": 2.0},
    {"min-p": -1},
    {"seed": -1},
    {"seed": 2**33},
    {"mirostat": 7},
    {"n-gpu-layers": -5},
    {"threads": 5000},
    {"flash-attn": "maybe"},
    {"embedding": "true"},
    {"sampling": 3},
    {"logit-bias": {"x": 1}},
    {"logit-bias": [[1]]},
    {"logit-bias": {"-1": 2}},
    {"grammar": "root ::= ("},
    {"json-schema": "{not json"},
    {"chat-template": 3},
    {"n-probs": 1000},
    {"max-time-ms": -1},
    {"priority": 1000},
    {"dry-base": 0.5},
    {"n-parallel": 0},
    {"batch-size": 0},
)
# not a JSON object, or not JSON at all: the host answers 2
BAD_JSON: tuple[bytes, ...] = (
    b"{",
    b"{not json",
    b'{"n-predict": }',
    b"[]",
    b"3",
    b'"str"',
    b"null",
    b"true",
    b"{'a': 1}",
    b'{"a": 1,}',
    b"\xff\xfe{}",
    b'{"n-predict": NaN}',
    b"[" * 2000 + b"]" * 2000,
    b'{"a":' * 600,
)


@st.composite
def configs(draw: st.DrawFn, *, model_keys: str = "profile") -> tuple[bytes, str]:
    """A configuration text and its class: "valid", "value" (errno 1 expected) or "json" (errno 2).

    ``model_keys``: "profile" draws load-time keys from MODEL_PROFILES only; "none" draws none (for
    ``load``: its models are loaded with default load-time keys, see :func:`make_env`); "any" also
    allows arbitrary load-time values (only for set_input metadata, where they are ignored).
    """
    kind = draw(weighted((12, st.just("valid")), (3, st.just("value")), (3, st.just("json")), (1, st.just("empty"))))
    if kind == "json":
        return draw(
            weighted((4, st.sampled_from(BAD_JSON)), (1, st.binary(min_size=1, max_size=24).filter(_not_json_object)))
        ), "json"
    if kind == "empty":
        return draw(st.sampled_from([b"", b"   ", b"{}", b'{"sampling": {}}'])), "valid"
    doc: dict[str, Any] = dict(draw(st.sampled_from(MODEL_PROFILES))) if model_keys != "none" else {}
    if model_keys == "any" and draw(st.booleans()):
        doc.update(draw(st.sampled_from([{"ctx-size": 99999}, {"n-gpu-layers": 3}, {"threads": 7}])))
    items = _context_items()
    chosen = draw(st.lists(st.sampled_from(items), max_size=5, unique_by=lambda kv: kv[0]))
    for key, values in chosen:
        doc[key] = draw(values)
    if draw(st.booleans()):  # keep generation short in most configs
        doc["n-predict"] = draw(st.integers(0, 8))
    if draw(weighted((5, st.just(False)), (1, st.just(True)))) and doc:  # the nested form
        key = draw(st.sampled_from(sorted(doc)))
        doc = {k: v for k, v in doc.items() if k != key} | {"sampling": {key: doc[key]}}
    if kind == "value":
        doc.update(draw(st.sampled_from(BAD_VALUES)))
    return json.dumps(doc).encode(), kind


def _not_json_object(raw: bytes) -> bool:
    try:
        return not isinstance(json.loads(raw), dict)
    except ValueError:
        return True
