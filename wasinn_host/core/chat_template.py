"""Opt-in host-side chat templates (config key ``chat-template``).

Guests normally apply a chat template themselves and send plain prompt text.  When
the graph's config sets ``chat-template``, the host does it instead:

* ``"chat-template": true`` uses the model's GGUF ``tokenizer.chat_template``;
* ``"chat-template": "<jinja source>"`` uses that template instead.

The prompt bytes a guest then sends (``set_input`` index 0) must be a JSON list of
``{"role": ..., "content": ...}`` messages; :func:`parse_messages` checks them and
:meth:`ChatTemplate.render` turns them into the prompt text, the way Hugging Face
Transformers and llama-cpp-python render chat templates: a sandboxed, immutable Jinja
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, a pass-through ``{% generation %}`` tag, a ``tojson`` filter that keeps
non-ASCII text, and the ``raise_exception(msg)`` and ``strftime_now(fmt)`` helpers.
Templates see ``messages``, ``bos_token``, ``eos_token`` and
``add_generation_prompt``.

Every failure here (bad message JSON, a template syntax error, a template that calls
``raise_exception`` or fails while rendering, ``true`` for a model without a
template) is a :class:`~wasinn_host.core.errors.WasiNNError` of kind
(``INVALID_ARGUMENT``) and a one-line message.  Note that invalid JSON in the
*messages* is an invalid argument too, unlike invalid *config* JSON (an invalid encoding): the messages are
prompt data, which the ABI receives as a tensor of bytes, not an encoded config.

The model side is left to the caller and passed in as plain strings:

* the template: the backend's model reads it (:meth:`~wasinn_host.core.runtime.Model.chat_template`;
  ``None`` when the model has none), and :func:`resolve_template` combines it with the config value;
* ``bos_token`` / ``eos_token``: the *text* of the model's BOS and EOS tokens, as
  llama-cpp-python gets them (``model.token_get_text(token_bos())``; ``""`` when
  the model has no such token).

A rendered prompt often begins with ``bos_token`` itself, so it should be tokenized
with special-token parsing on and without adding another BOS when it already starts
with one (llama-cpp-python does the same).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.exceptions
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import orjson
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .config.keys import json_type
from .errors import invalid

__all__ = [
    "DEFAULT_CHATML",
    "ChatTemplate",
    "parse_messages",
    "resolve_template",
]

#: The standard ChatML template (as in llama-cpp-python's ``CHATML_CHAT_TEMPLATE``).
#: Not used as a fallback: ``chat-template: true`` on a model without a template is
#: an error.  Pass it (or any template) as the config string to use it explicitly.
DEFAULT_CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_EXPECTED = 'expected a JSON list of {"role": ..., "content": ...}'


class _TemplateRaised(Exception):
    """What ``raise_exception(msg)`` raises inside a template."""


class _IgnoreGenerationTags(jinja2.ext.Extension):
    """Pass-through for Hugging Face's ``{% generation %}...{% endgeneration %}`` tag."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        parser.stream.skip(1)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _one_line(text: str) -> str:
    """Collapse whitespace runs (newlines included) so a message fits one log line."""
    return " ".join(str(text).split())


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """``tojson`` as Transformers defines it: plain ``json.dumps``, non-ASCII kept."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(),
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_IgnoreGenerationTags, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    return env


class ChatTemplate:
    """A compiled chat template plus the model's BOS/EOS token text.

    Raises an invalid argument at construction when the template has a Jinja syntax error.
    """

    def __init__(self, template: str, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = template
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(template)
        except jinja2.TemplateSyntaxError as exc:
            raise invalid(
                f"chat-template: template syntax error at line {exc.lineno}: {_one_line(exc.message or '')}"
            ) from exc
        except jinja2.TemplateError as exc:
            raise invalid(f"chat-template: template error: {_one_line(str(exc))}") from exc

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """Render ``messages`` into prompt text; any rendering failure is an invalid argument."""
        try:
            return self._template.render(
                messages=messages,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                add_generation_prompt=add_generation_prompt,
                raise_exception=_raise_exception,
                strftime_now=_strftime_now,
            )
        except _TemplateRaised as exc:
            raise invalid(f"chat-template: template rejected the messages: {_one_line(str(exc))}") from exc
        except jinja2.UndefinedError as exc:
            raise invalid(f"chat-template: template used an undefined value: {_one_line(exc.message or '')}") from exc
        except jinja2.exceptions.SecurityError as exc:
            raise invalid(f"chat-template: template blocked by the sandbox: {_one_line(str(exc))}") from exc
        except jinja2.TemplateError as exc:
            raise invalid(f"chat-template: template error: {_one_line(str(exc))}") from exc
        except Exception as exc:  # noqa: BLE001 - any other failure comes from template/data
            raise invalid(
                f"chat-template: template failed while rendering: {type(exc).__name__}: {_one_line(str(exc))}"
            ) from exc


def parse_messages(data: bytes) -> list[dict[str, Any]]:
    """Parse the guest's prompt bytes as chat messages, strictly.

    Accepted: UTF-8 JSON text holding a non-empty list of objects, each with a string
    ``role`` and a string ``content``; other keys are kept and reach the template.
    Anything else (invalid UTF-8, invalid JSON, including ``NaN`` and unpaired
    surrogate escapes, which orjson rejects, or a wrong shape) raises an invalid
    argument; invalid JSON is an invalid argument here, not an invalid encoding, because this is prompt
    data and not config.  Messages are numbered from 1 in error messages.
    """
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"chat-template: prompt is not valid UTF-8 (byte {exc.start}); {_EXPECTED}") from exc
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise invalid(f"chat-template: prompt is not valid JSON ({_one_line(str(exc))}); {_EXPECTED}") from exc
    if not isinstance(value, list):
        raise invalid(f"chat-template: prompt is a JSON {json_type(value)}, not a list; {_EXPECTED}")
    if not value:
        raise invalid(f"chat-template: prompt is an empty list; {_EXPECTED}")
    for number, message in enumerate(value, start=1):
        _check_message(number, message)
    return value


def _check_message(number: int, message: Any) -> None:
    if not isinstance(message, dict):
        raise invalid(f"chat-template: message {number} is a JSON {json_type(message)}, not an object; {_EXPECTED}")
    for key in ("role", "content"):
        if not isinstance(message.get(key), str):
            raise invalid(f'chat-template: message {number} has no string "{key}"; {_EXPECTED}')


def resolve_template(setting: bool | str, model_template: str | None) -> str | None:
    """The template source to use for a ``chat-template`` config value.

    ``False`` means no host-side templating (``None``); ``True`` means the model's
    template (an invalid argument when the model has none); a string is the template itself.
    """
    if setting is False:
        return None
    if setting is True:
        if not model_template:
            raise invalid("chat-template: model has no tokenizer.chat_template; pass the template as a string")
        return model_template
    if isinstance(setting, str):
        return setting
    raise invalid(f"chat-template: expected true, false or a template string, got {type(setting).__name__}")
