"""Host-side chat templates: message parsing, rendering and every errno-1 path."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from wasinn_host import Errno, WasiNNError
from wasinn_host.core.chat_template import (
    DEFAULT_CHATML,
    ChatTemplate,
    parse_messages,
    resolve_template,
)
from wasinn_host.ephemeral.errno import errno_for
from wasinn_host.llama.model import model_chat_template
from wasinn_host.testing import gguf_models as testmodels

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "2+2?"},
]

CHATML_EXPECTED = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n"
    "<|im_start|>assistant\nHello.<|im_end|>\n"
    "<|im_start|>user\n2+2?<|im_end|>\n"
)

# Llama 3's template, trimmed: exercises bos_token, namespace-free loops and trim/lstrip.
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def _errno1(exc_info: pytest.ExceptionInfo[WasiNNError]) -> str:
    """Assert errno 1 and a one-line message; return the message."""
    err = exc_info.value
    assert errno_for(err.kind) == Errno.INVALID_ARGUMENT
    assert "\n" not in err.message
    assert err.message.startswith("chat-template: ")
    return err.message


def _messages(data: object) -> bytes:
    return json.dumps(data).encode()


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def test_chatml_exact_with_generation_prompt() -> None:
    out = ChatTemplate(DEFAULT_CHATML).render(parse_messages(_messages(CONVERSATION)))
    assert out == CHATML_EXPECTED + "<|im_start|>assistant\n"


def test_chatml_without_generation_prompt() -> None:
    out = ChatTemplate(DEFAULT_CHATML).render(CONVERSATION, add_generation_prompt=False)
    assert out == CHATML_EXPECTED


def test_custom_template_uses_bos_and_trim_blocks() -> None:
    template = ChatTemplate(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
    out = template.render([{"role": "user", "content": "  hey \n"}])
    assert out == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhey<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_block_tags_do_not_leave_whitespace() -> None:
    source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}"
    out = ChatTemplate(source).render([{"role": "user", "content": "a"}, {"role": "x", "content": "b"}])
    assert out == "[a]\n"


def test_eos_token_and_extra_keys_reach_template() -> None:
    source = "{% for m in messages %}{{ m.name }}:{{ m.content }}{{ eos_token }}{% endfor %}"
    msgs = parse_messages(_messages([{"role": "user", "content": "hi", "name": "ann"}]))
    assert msgs == [{"role": "user", "content": "hi", "name": "ann"}]
    assert ChatTemplate(source, eos_token="</s>").render(msgs) == "ann:hi</s>"


def test_tojson_keeps_non_ascii_and_loopcontrols_and_generation_tag() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}"
    )
    out = ChatTemplate(source).render([{"role": "user", "content": "héllo"}, {"role": "user", "content": "x"}])
    assert out == '{"role": "user", "content": "héllo"}'


def test_strftime_now_available() -> None:
    out = ChatTemplate("{{ strftime_now('%Y') }}").render([{"role": "user", "content": ""}])
    assert re.fullmatch(r"\d{4}", out)


def test_namespace_works_in_immutable_sandbox() -> None:
    source = (
        "{% set ns = namespace(sys='') %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% set ns.sys = m.content %}{% endif %}{% endfor %}{{ ns.sys }}"
    )
    assert ChatTemplate(source).render(CONVERSATION) == "You are terse."


# ---------------------------------------------------------------------------------------------
# Template errors
# ---------------------------------------------------------------------------------------------


def test_syntax_error_is_errno1_with_line() -> None:
    with pytest.raises(WasiNNError) as info:
        ChatTemplate("ok\n{% for m in messages %}{{ m.content }")
    message = _errno1(info)
    assert "syntax error at line 2" in message


def test_unknown_tag_is_errno1() -> None:
    with pytest.raises(WasiNNError) as info:
        ChatTemplate("{% frobnicate %}")
    assert "syntax error" in _errno1(info)


def test_raise_exception_is_errno1_with_template_message() -> None:
    source = "{% if messages[0].role != 'system' %}{{ raise_exception('System role first!\nplease') }}{% endif %}ok"
    template = ChatTemplate(source)
    assert template.render(CONVERSATION) == "ok"
    with pytest.raises(WasiNNError) as info:
        template.render([{"role": "user", "content": "x"}])
    assert _errno1(info) == "chat-template: template rejected the messages: System role first! please"


def test_undefined_attribute_chain_is_errno1() -> None:
    with pytest.raises(WasiNNError) as info:
        ChatTemplate("{{ messages[0].missing.deeper }}").render([{"role": "user", "content": "x"}])
    assert "undefined" in _errno1(info)


def test_calling_undefined_function_is_errno1() -> None:
    with pytest.raises(WasiNNError) as info:
        ChatTemplate("{{ no_such_helper('x') }}").render([{"role": "user", "content": "x"}])
    assert "no_such_helper" in _errno1(info)


def test_sandbox_blocks_mutation() -> None:
    with pytest.raises(WasiNNError) as info:
        ChatTemplate("{{ messages.append(1) }}").render([{"role": "user", "content": "x"}])
    assert "blocked by the sandbox" in _errno1(info)


def test_sandbox_blocks_attribute_escape() -> None:
    with pytest.raises(WasiNNError) as info:
        ChatTemplate("{{ ''.__class__.__mro__ }}").render([{"role": "user", "content": "x"}])
    assert "blocked by the sandbox" in _errno1(info)


def test_python_error_while_rendering_is_errno1() -> None:
    with pytest.raises(WasiNNError) as info:
        ChatTemplate("{{ 1 // 0 }}").render([{"role": "user", "content": "x"}])
    assert "ZeroDivisionError" in _errno1(info)


# ---------------------------------------------------------------------------------------------
# Message validation
# ---------------------------------------------------------------------------------------------

EXPECTED_HINT = 'expected a JSON list of {"role": ..., "content": ...}'


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"\xff[]", "not valid UTF-8 (byte 0)"),
        (b"", "not valid JSON"),
        (b'[{"role": "user",', "not valid JSON"),
        (b"Hello there", "not valid JSON"),
        (b"[NaN]", "not valid JSON"),
        (b'[{"role": "user", "content": "\\ud800"}]', "not valid JSON"),
        (b"{}", "prompt is a JSON object, not a list"),
        (b'"hi"', "prompt is a JSON string, not a list"),
        (b"null", "prompt is a JSON null, not a list"),
        (b"[]", "prompt is an empty list"),
        (b'[{"role": "user", "content": "a"}, 3]', "message 2 is a JSON number, not an object"),
        (b"[[]]", "message 1 is a JSON array, not an object"),
        (b'[{"content": "a"}]', 'message 1 has no string "role"'),
        (b'[{"role": 1, "content": "a"}]', 'message 1 has no string "role"'),
        (b'[{"role": "user", "content": "a"}, {"role": "user"}]', 'message 2 has no string "content"'),
        (b'[{"role": "user", "content": null}]', 'message 1 has no string "content"'),
        (b'[{"role": "user", "content": [{"type": "text"}]}]', 'message 1 has no string "content"'),
    ],
)
def test_parse_messages_rejects(data: bytes, needle: str) -> None:
    with pytest.raises(WasiNNError) as info:
        parse_messages(data)
    message = _errno1(info)
    assert needle in message
    assert message.endswith(EXPECTED_HINT)


def test_parse_messages_exact_message() -> None:
    with pytest.raises(WasiNNError) as info:
        parse_messages(b'[{"role": "user", "content": "a"}, {"role": "user"}]')
    assert _errno1(info) == f'chat-template: message 2 has no string "content"; {EXPECTED_HINT}'
    assert str(info.value).endswith("(invalid argument)")


def test_parse_messages_accepts_bytearray_and_unicode() -> None:
    data = bytearray(json.dumps([{"role": "user", "content": "日本 🙂"}], ensure_ascii=False).encode())
    assert parse_messages(bytes(data)) == [{"role": "user", "content": "日本 🙂"}]


# ---------------------------------------------------------------------------------------------
# Picking the template
# ---------------------------------------------------------------------------------------------


def test_resolve_template() -> None:
    assert resolve_template(False, "{{ x }}") is None
    assert resolve_template(True, "model tpl") == "model tpl"
    assert resolve_template("custom", "model tpl") == "custom"
    assert resolve_template("custom", None) == "custom"


@pytest.mark.parametrize("model_template", [None, ""])
def test_resolve_true_without_model_template_is_errno1(model_template: str | None) -> None:
    with pytest.raises(WasiNNError) as info:
        resolve_template(True, model_template)
    assert _errno1(info) == ("chat-template: model has no tokenizer.chat_template; pass the template as a string")


def test_model_chat_template_with_fake_reader() -> None:
    assert model_chat_template("m", lambda model, name: None) is None
    assert model_chat_template("m", lambda model, name: "é".encode()) == "é"
    with pytest.raises(WasiNNError) as info:
        model_chat_template("m", lambda model, name: b"\xff")
    assert "not valid UTF-8" in _errno1(info)


def _write_model_with_template(path: pathlib.Path, template: str | None) -> pathlib.Path:
    """The project's successor test model, optionally with a tokenizer.chat_template key."""
    shape = testmodels._successor_shape(64, 1)
    return testmodels.write_llama_gguf(
        path,
        shape,
        testmodels._build_vocab(shape.n_vocab),
        testmodels._successor_tensors(shape, 20.0),
        name="chat-test",
        f16=False,
        chat_template=template,
    )


@pytest.mark.parametrize("template", [None, DEFAULT_CHATML + "{# " + "é" * 3000 + " #}"])
def test_model_chat_template_from_real_gguf(tmp_path: pathlib.Path, template: str | None) -> None:
    from wasinn_host.core.config.params import ModelParams
    from wasinn_host.llama.model import LlamaModel

    path = _write_model_with_template(tmp_path / "chat.gguf", template)
    model = LlamaModel(path, ModelParams())
    try:
        got = model_chat_template(model.ptr)
    finally:
        model.close()
    assert got == template
    if got is not None:
        out = ChatTemplate(got).render([{"role": "user", "content": "Hi"}])
        assert out == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
