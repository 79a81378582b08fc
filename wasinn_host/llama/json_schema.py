"""A config's ``json-schema`` as the GBNF grammar llama.cpp enforces.

The core keeps the schema as the guest gave it (checked to be JSON when the config is parsed) and knows
no grammar language; this backend converts it with llama-cpp-python's converter (llama.cpp's
``json_schema_to_grammar``) when it checks the sampling parameters and when it builds a sampler.  The
schema's grammar is the one enforced: a config that sets a schema clears its ``grammar`` key.
"""

from __future__ import annotations

import functools

from ..core.config.params import SamplingParams
from ..core.errors import invalid
from .bindings import llama_cpp


def sampling_grammar(params: SamplingParams) -> str:
    """The GBNF grammar a sampler for ``params`` enforces: the JSON schema's when one is given, else the
    ``grammar`` key's (``""``: none)."""
    return schema_to_grammar(params.json_schema) if params.json_schema else params.grammar


@functools.lru_cache(maxsize=64)
def schema_to_grammar(schema: str) -> str:
    """JSON schema text to GBNF (llama.cpp's converter); an invalid argument with the reason if it fails.

    Cached: a context's schema is converted when it is configured and again for every sampler built."""
    convert = llama_cpp.llama_grammar.json_schema_to_gbnf  # pure Python, imported on first use
    try:
        return str(convert(schema))
    except Exception as exc:  # the converter raises plain exceptions of several kinds
        raise invalid(f"config key 'json-schema': cannot convert to a grammar: {type(exc).__name__}: {exc}") from None
