"""The demo model's data: vocabulary, conversations, held-out problems and an evaluator.

The embedded demo model (``wasinn_host/models/demo-arith.gguf``) answers 1-3 digit addition and
subtraction questions asked in the last user turn of a ChatML conversation. This module is the
single source of truth for everything its training script, its evaluation script and the tests
share, so it imports neither torch nor (until an evaluation runs) llama_cpp:

* the vocabulary (:data:`TOKENS`, :data:`TOKEN_TYPES`) and a reference tokenizer (:func:`encode`) that
  reproduces what llama.cpp's SPM tokenizer does with this vocabulary, BOS added and special tokens parsed;
* the conversation generator used for training (:func:`sample_conversation`), and
* :func:`make_problems`, held-out prompts with their expected answers, for tests to import.

Prompt format (what ``make_problems`` returns; the host adds BOS when it tokenizes)::

    [<|im_start|>system\\n{0-150 chars}<|im_end|>\\n]                       optional
    (<|im_start|>user\\n{question}<|im_end|>\\n
     <|im_start|>assistant\\n{answer}<|im_end|>[<|im_end|>]\\n) x 0..3     earlier turns
    <|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n

where ``{question}`` is ``What is 12+30?`` or ``12+30=`` and the expected completion is the bare number
(``42``, ``-18``) followed by the end-of-turn token ``<|im_end|>``. Final questions are drawn only from
a held-out slice of the problem space (:func:`is_held_out`) that training never uses.

Evaluate from the command line with ``python scripts/training/eval_demo_model.py``.
"""

from __future__ import annotations

import pathlib
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

# --------------------------------------------------------------------------------------------------
# Vocabulary: SPM ("llama") model with byte fallback, one token per printable ASCII character.
# --------------------------------------------------------------------------------------------------

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPACE_PIECE = "\u2581"  # SPM writes ' ' as '▁' before lookup, so the space token is spelled '▁'.

TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_BYTE = 6


def _build_vocab() -> tuple[list[str], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(TOKEN_TYPE_BYTE)
    tokens.append(SPACE_PIECE)
    types.append(TOKEN_TYPE_NORMAL)
    for c in range(0x21, 0x7F):
        tokens.append(chr(c))
        types.append(TOKEN_TYPE_NORMAL)
    tokens += [IM_START, IM_END]
    types += [TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL]
    return tokens, types


TOKENS, TOKEN_TYPES = _build_vocab()
TOKEN_ID: dict[str, int] = {t: i for i, t in enumerate(TOKENS)}
UNK_ID, BOS_ID = 0, 1
IM_START_ID = TOKEN_ID[IM_START]
IM_END_ID = TOKEN_ID[IM_END]
EOS_ID = IM_END_ID
VOCAB_SIZE = len(TOKENS)
CONTEXT_LENGTH = 512

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Per-character token ids: printable ASCII maps to its own token, everything else to byte tokens.
_CHAR_IDS: dict[str, list[int]] = {}


def _char_ids(ch: str) -> list[int]:
    ids = _CHAR_IDS.get(ch)
    if ids is None:
        piece = SPACE_PIECE if ch == " " else ch
        if piece in TOKEN_ID and TOKEN_TYPES[TOKEN_ID[piece]] == TOKEN_TYPE_NORMAL:
            ids = [TOKEN_ID[piece]]
        else:
            ids = [TOKEN_ID[f"<0x{b:02X}>"] for b in ch.encode("utf-8")]
        _CHAR_IDS[ch] = ids
    return ids


# Text that llama.cpp's special-token parsing turns into single tokens (CONTROL and UNKNOWN types).
_SPECIAL_TEXT = [t for t, ty in zip(TOKENS, TOKEN_TYPES) if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN)]
_SPECIAL_TEXT.sort(key=len, reverse=True)


def encode(text: str, add_bos: bool = True) -> list[int]:
    """Tokenize like ``llama_tokenize(..., add_special=add_bos, parse_special=True)`` does here."""
    ids = [BOS_ID] if add_bos else []
    i = 0
    while i < len(text):
        if text[i] == "<":
            special = next((s for s in _SPECIAL_TEXT if text.startswith(s, i)), None)
            if special is not None:
                ids.append(TOKEN_ID[special])
                i += len(special)
                continue
        ids.extend(_char_ids(text[i]))
        i += 1
    return ids


def decode(ids: Sequence[int]) -> str:
    """Inverse of :func:`encode` for ids the model can produce (specials rendered as text)."""
    out = bytearray()
    for t in ids:
        tok = TOKENS[t]
        if TOKEN_TYPES[t] == TOKEN_TYPE_BYTE:
            out.append(int(tok[3:5], 16))
        else:
            out += tok.replace(SPACE_PIECE, " ").encode("utf-8")
    return out.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------------------
# Problems and conversations.
# --------------------------------------------------------------------------------------------------

_DIGIT_RANGES = ((0, 9), (10, 99), (100, 999))


def random_operand(rng: random.Random) -> int:
    """A 1-, 2- or 3-digit operand, each length equally likely."""
    lo, hi = _DIGIT_RANGES[rng.randrange(3)]
    return rng.randint(lo, hi)


def is_held_out(a: int, b: int, op: str) -> bool:
    """About 1/32 of all (a, op, b) problems are reserved for evaluation and never trained on."""
    key = (a * 1000 + b) * 2 + (op == "-")
    h = (key * 2654435761 + 0x9E3779B9) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 2246822519) & 0xFFFFFFFF
    h ^= h >> 13
    return h % 32 == 0


def random_problem(rng: random.Random, held_out: bool) -> tuple[int, str, int]:
    """A random problem inside (``held_out``) or outside the evaluation slice."""
    while True:
        a, b = random_operand(rng), random_operand(rng)
        op = "+" if rng.random() < 0.5 else "-"
        if is_held_out(a, b, op) == held_out:
            return a, op, b


def format_question(rng: random.Random, a: int, op: str, b: int) -> str:
    """The question in one of its two spellings."""
    return f"What is {a}{op}{b}?" if rng.random() < 0.5 else f"{a}{op}{b}="


def answer_of(a: int, op: str, b: int) -> str:
    """The answer as the model writes it."""
    return str(a + b if op == "+" else a - b)


_SYSTEM_SENTENCES = [
    "You are a helpful assistant.",
    "You are a helpful, respectful and honest assistant.",
    "You are a calculator. Reply with the number only.",
    "Answer briefly.",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "You are a friendly bot that helps kids with math homework.",
    "Always answer with just the result.",
    "Be concise. Do not explain your reasoning.",
    "You are an AI assistant running inside a WebAssembly sandbox.",
    "The user is testing arithmetic. Keep answers short.",
    "Today is Monday, 3 March 2025. Knowledge cutoff: 2024-06.",
    "You are wasinn-demo, a tiny model.",
]
_WORDS = (
    "the a of to and in is you that it for on are with as be this was have or at by not from "
    "but what all were when we there can an your which their said if will each about how up out "
    "them then she many some so these would other into has more her two like him see time could "
    "no make than first been its who now people my made over did down only way find use may water "
    "long little very after words called just where most know get through back much before go good "
    "new write our used me man too any day same right look think also around another came come work "
    "three word must because does part even place well such here take why things help put years "
    "different away again off went old number great tell men say small every found still between "
    "name should home big give air line set own under read last never us left end along while might "
    "next sound below saw something thought both few those always looked show large often together "
    "asked house don't world going want school important until form food keep children feet land side "
    "without boy once animals life enough took sometimes four head above kind began almost live page "
    "got earth need far hand high year mother light parts country father let night following picture "
    "being study second eyes soon times story boys since white days ever paper hard near sentence "
    "better best across during today others however sure means knew it's try told young miles sun "
    "ways thing whole hear example heard several change answer room sea against top turned learn "
    "point city play toward five using himself usually math assistant model user please reply"
).split()
_PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))


def random_system_text(rng: random.Random) -> str:
    """Random system-prompt content of 0-150 characters (sentences, word salad or character noise)."""
    limit = rng.randint(0, 150)
    kind = rng.random()
    parts: list[str] = []
    length = 0
    while length < limit:
        if kind < 0.4:
            piece = rng.choice(_SYSTEM_SENTENCES)
        elif kind < 0.85:
            piece = rng.choice(_WORDS)
            r = rng.random()
            if r < 0.08:
                piece = piece.capitalize()
            elif r < 0.14:
                piece += rng.choice(".,:;!?")
            elif r < 0.17:
                piece = str(rng.randint(0, 2025))
            elif r < 0.19:
                piece += "\n"
        else:
            piece = "".join(rng.choice(_PRINTABLE) for _ in range(rng.randint(1, 12)))
        parts.append(piece)
        length += len(piece) + 1
    text = " ".join(parts)[:limit]
    return text.replace(" \n", "\n").replace("\n ", "\n")


@dataclass
class Conversation:
    """A conversation as segments of text; ``targets`` marks the segments a model should predict."""

    segments: list[str]
    targets: list[bool]
    answer: str  # the final assistant answer (without <|im_end|>)

    @property
    def prompt(self) -> str:
        """Everything before the final answer: the text a client sends, ending in 'assistant\\n'."""
        return "".join(self.segments[:-1])


@dataclass(frozen=True)
class Style:
    """How a client spells ChatML; ``None`` fields are drawn at random per conversation."""

    newline_after_assistant: bool = True
    """``<|im_start|>assistant\n`` (the usual template) or ``<|im_start|>assistant`` (LlamaEdge's)."""
    question_suffix: str = ""
    """What follows the question before ``<|im_end|>``: nothing, a space or a newline."""
    system: bool | None = None
    """A system message, none, or either (``p_system``)."""
    repeat_end: bool | None = None
    """Earlier answers written back with a repeated ``<|im_end|>`` (as clients that keep the generated
    end token do), without, or either (30 %); True implies at least one earlier turn."""


VARIANTS: dict[str, Style] = {
    "standard": Style(),
    "no-newline-after-assistant": Style(newline_after_assistant=False),
    "system-message": Style(system=True),
    "no-system-message": Style(system=False),
    "repeated-end-in-history": Style(repeat_end=True),
    "single-end-in-history": Style(repeat_end=False),
    "space-after-question": Style(question_suffix=" "),
    "newline-after-question": Style(question_suffix="\n"),
}
"""The spellings real chat clients use, one held-out evaluation each."""


def random_style(rng: random.Random, p_no_newline: float = 0.4, p_suffix: float = 0.3) -> Style:
    """A style for training: LlamaEdge's missing newline and a space or newline after the question
    mixed in with the usual spelling."""
    newline = rng.random() >= p_no_newline
    suffix = rng.choice((" ", "\n")) if rng.random() < p_suffix else ""
    return Style(newline_after_assistant=newline, question_suffix=suffix)


def sample_conversation(
    rng: random.Random,
    held_out: bool = False,
    p_system: float = 0.5,
    max_history: int = 3,
    p_simple: float = 0.0,
    style: Style = Style(),
) -> Conversation:
    """One ChatML conversation ending in an assistant answer to an arithmetic question.

    ``held_out`` draws the final question from the evaluation slice (training uses ``False``). With
    probability ``p_simple`` the conversation has no system message and no history. Earlier turns
    always hold training-slice problems with correct answers, written back like clients do (the
    end token sometimes repeated because the generated text included it). ``style`` spells it.
    """
    segments: list[str] = []
    targets: list[bool] = []
    assistant = f"{IM_START}assistant" + ("\n" if style.newline_after_assistant else "")

    def add(text: str, target: bool = False) -> None:
        segments.append(text)
        targets.append(target)

    def question(a: int, op: str, b: int) -> str:
        return f"{IM_START}user\n{format_question(rng, a, op, b)}{style.question_suffix}{IM_END}\n{assistant}"

    simple = rng.random() < p_simple
    system = rng.random() < p_system if style.system is None else style.system
    if not simple and system:
        add(f"{IM_START}system\n{random_system_text(rng)}{IM_END}\n")
    n_history = 0 if simple else rng.randint(0, max_history)
    if style.repeat_end:
        n_history = max(n_history, 1)
    for _ in range(n_history):
        a, op, b = random_problem(rng, held_out=False)
        add(question(a, op, b))
        add(answer_of(a, op, b) + IM_END, target=True)
        repeat = rng.random() < 0.3 if style.repeat_end is None else style.repeat_end
        add((IM_END if repeat else "") + "\n")
    a, op, b = random_problem(rng, held_out=held_out)
    answer = answer_of(a, op, b)
    add(question(a, op, b))
    add(answer + IM_END, target=True)
    return Conversation(segments, targets, answer)


def make_problems(n: int, seed: int, style: Style = Style()) -> list[tuple[str, str]]:
    """``n`` held-out (ChatML prompt, expected answer) pairs spelled in ``style``; the prompt has no
    BOS and ends in ``<|im_start|>assistant`` (with ``\n`` in the usual style); the answer is the bare
    number, e.g. ``"-18"``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        conv = sample_conversation(rng, held_out=True, style=style)
        out.append((conv.prompt, conv.answer))
    return out


# --------------------------------------------------------------------------------------------------
# Evaluation through llama.cpp.
# --------------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    """Accuracy of one evaluation run and the greedy outputs."""

    accuracy: float
    correct: int
    total: int
    outputs: list[str]  # greedy completions, end token stripped
    tokenizer_mismatches: int  # prompts llama.cpp tokenized differently from :func:`encode`
    seconds: float


_LOG_CALLBACK = None


def eval_gguf(
    model_path: str | pathlib.Path,
    problems: Sequence[tuple[str, str]],
    threads: int = 1,
    max_new_tokens: int = 8,
) -> EvalResult:
    """Greedy-decode every prompt with llama.cpp (BOS added, specials parsed) and score exact match."""
    import llama_cpp

    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:  # keep a reference: llama.cpp calls it long after this returns
        _LOG_CALLBACK = llama_cpp.llama_log_callback(lambda *_: None)
        llama_cpp.llama_log_set(_LOG_CALLBACK, None)
    from ..llama import cpu_probe

    cpu_probe.prepare_for_file(model_path)  # a quantized copy must not meet a crashing CPU layout
    llm = llama_cpp.Llama(
        model_path=str(model_path),
        n_ctx=CONTEXT_LENGTH,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    import numpy as np

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llm.n_vocab()
    start = time.perf_counter()
    correct = mismatches = 0
    outputs: list[str] = []
    for prompt, expected in problems:
        tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        if tokens != encode(prompt):
            mismatches += 1
        llm.reset()
        llm.eval(tokens)
        generated: list[int] = []
        for _ in range(max_new_tokens):
            # Llama keeps no logits without logits_all; read the last row from the context.
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
            tok = int(logits.argmax())
            if llama_cpp.llama_vocab_is_eog(vocab, tok):
                break
            generated.append(tok)
            llm.eval([tok])
        text = llm.detokenize(generated).decode("utf-8", errors="replace")
        outputs.append(text)
        correct += text == expected
    seconds = time.perf_counter() - start
    llm.close()
    total = len(problems)
    return EvalResult(correct / max(total, 1), correct, total, outputs, mismatches, seconds)
