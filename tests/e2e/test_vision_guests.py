"""Qwen2-VL's M-RoPE positions, and WasmEdge's gemma-3 and qwen2vl example guests, on the project's tiny models.

A Qwen2-VL projector gives an image fewer sequence positions than tokens (its tokens sit on a 2-D
grid); the host's answers must equal what libmtmd's own helper decodes with llama.cpp directly (the
native reference, below), in one turn, with a repeated image from the KV cache, and beside other
sequences.  ``guest_examples/gemma3.wasm`` and ``qwen2vl.wasm`` (C ports of WasmEdge's example guests:
``mmproj`` and ``image`` from the environment, a prompt argument or a chat on stdin) run through
``wasinn run`` and print the host's answers.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import llama_cpp
import pytest
from llama_cpp import mtmd_cpp as mtmd

from wasinn_host import ModelRegistry, WasiNN
from wasinn_host.backend.local import LocalBackend
from wasinn_host.core.config.limits import Limits
from wasinn_host.core.config.preload import Preload
from wasinn_host.rpc.server import NNServer
from wasinn_host.testing.guest_runs import wasinn_cli
from wasinn_host.testing.vision_models import img_tag, solid_png, write_vision_model

GREEDY = {"temp": 0, "n-predict": 8}
RED, BLUE, GREEN = solid_png(255, 0, 0), solid_png(0, 0, 255), solid_png(0, 255, 0)


@pytest.fixture(scope="module")
def qwen_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    return write_vision_model(tmp_path_factory.mktemp("qwen2vl"), kind="qwen2vl")


@pytest.fixture(scope="module")
def qwen_nn(qwen_files: tuple[pathlib.Path, pathlib.Path]) -> Iterator[WasiNN]:
    text, projector = qwen_files
    registry = ModelRegistry([Preload("q", text, mmproj=projector)])
    yield WasiNN(registry=registry)
    registry.close()


def answer(nn: WasiNN, prompt: str, name: str = "q", config: dict[str, object] | None = None) -> tuple[str, int]:
    """The host's greedy answer to ``prompt`` and its input token count."""
    with nn.session(name, config or GREEDY) as session:
        text = session.complete(prompt)
        return text, int(session.metadata["input_tokens"])


def native_answer(files: tuple[pathlib.Path, pathlib.Path], before: str, image: bytes, after: str) -> tuple[str, int]:
    """llama.cpp and libmtmd alone: ``mtmd_helper_eval_chunks`` decodes the prompt with the image (it
    sets the M-RoPE positions itself), then greedy decoding from the position it returns; the text
    of GREEDY's 8 tokens and the number of prompt tokens."""
    text_path, projector = files
    model = llama_cpp.llama_model_load_from_file(str(text_path).encode(), llama_cpp.llama_model_default_params())
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch = 512, 512
    context = llama_cpp.llama_init_from_model(model, cparams)
    mparams = mtmd.mtmd_context_params_default()
    mparams.use_gpu, mparams.warmup, mparams.print_timings = False, False, False
    vision = mtmd.mtmd_init_from_file(str(projector).encode(), model, mparams)
    vocab = llama_cpp.llama_model_get_vocab(model)
    chunks = mtmd.mtmd_input_chunks_init()
    try:
        assert mtmd.mtmd_decode_use_mrope(vision), "a Qwen2-VL projector uses M-RoPE"
        prompt = f"{before}{mtmd.mtmd_default_marker().decode()}{after}".encode()
        inp = mtmd.mtmd_input_text()
        inp.text, inp.text_len, inp.add_special, inp.parse_special = prompt, len(prompt), True, True
        buf = (ctypes.c_uint8 * len(image)).from_buffer_copy(image)
        options = mtmd.mtmd_helper_init_opt_default()
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(vision, buf, len(image), False, options)
        bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
        assert mtmd.mtmd_tokenize(vision, chunks, ctypes.byref(inp), bitmaps, 1) == 0
        mtmd.mtmd_bitmap_free(bitmap)
        n_prompt = int(mtmd.mtmd_helper_get_n_tokens(chunks))
        n_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(vision, context, chunks, 0, 0, 512, True, ctypes.byref(n_past)) == 0
        batch = llama_cpp.llama_batch_init(1, 0, 1)
        pieces, pos = b"", n_past.value
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        try:
            for _ in range(GREEDY["n-predict"]):
                logits = llama_cpp.llama_get_logits_ith(context, -1)
                token = max(range(n_vocab), key=lambda t: logits[t])
                if llama_cpp.llama_vocab_is_eog(vocab, token):
                    break
                piece = ctypes.create_string_buffer(64)
                n = llama_cpp.llama_token_to_piece(vocab, token, piece, 64, 0, True)
                pieces += piece.raw[:n]
                batch.n_tokens = 1
                batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = token, pos, 1, True
                batch.seq_id[0][0] = 0
                assert llama_cpp.llama_decode(context, batch) == 0
                pos += 1
        finally:
            llama_cpp.llama_batch_free(batch)
        return pieces.decode("utf-8", "replace"), n_prompt
    finally:
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_free(vision)
        llama_cpp.llama_free(context)
        llama_cpp.llama_model_free(model)


def test_qwen2vl_answers_equal_libmtmds_own_decoding(
    qwen_nn: WasiNN, qwen_files: tuple[pathlib.Path, pathlib.Path]
) -> None:
    """An image is 4 tokens on 2 positions here; positions as token indices would give other answers."""
    for image in (RED, BLUE):
        native = native_answer(qwen_files, "ab ", image, " cd")
        assert answer(qwen_nn, f"ab {img_tag(image)} cd") == native
    assert answer(qwen_nn, f"ab {img_tag(RED)} cd")[0] != answer(qwen_nn, f"ab {img_tag(BLUE)} cd")[0]
    assert answer(qwen_nn, f"ab {img_tag(GREEN)} cd")[0] != answer(qwen_nn, f"ab {img_tag(RED)} cd")[0]


def test_qwen2vl_follow_up_turn_reuses_the_image_and_matches_a_fresh_decode(qwen_nn: WasiNN) -> None:
    first = f"ab {img_tag(RED)} cd"
    with qwen_nn.session("q", GREEDY) as session:
        reply = session.complete(first)
        n_first = session.metadata["input_tokens"]
        second = first + reply + " ef"
        again = session.complete(second)
        assert session.metadata["reused_tokens"] >= n_first, "text and image before the new turn are kept"
    assert answer(qwen_nn, second)[0] == again, "text after the image at the same positions as a fresh decode"


def test_qwen2vl_contexts_at_once_match_one_at_a_time(qwen_nn: WasiNN) -> None:
    prompts = [f"ab {img_tag(image)} cd{i}" for i, image in enumerate((RED, BLUE, GREEN, RED))]
    alone = [answer(qwen_nn, p)[0] for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: answer(qwen_nn, p)[0], prompts))
    assert together == alone


def test_qwen2vl_context_full_after_an_image_stops_instead_of_shifting(qwen_nn: WasiNN) -> None:
    """Shifting moves positions by a token count, which M-RoPE images do not follow: the generation stops."""
    config = {"temp": 0, "n-predict": 100, "ctx-size": 64, "ctx-shift": True, "ignore-eos": True}
    with qwen_nn.session("q", config) as session:
        session.complete(f"ab {img_tag(RED)} cd")
        assert session.metadata["stop_reason"] == "context full"
        assert session.metadata["input_tokens"] + session.metadata["output_tokens"] == 64 + 1, "the last is not decoded"


# -- WasmEdge's gemma-3 and qwen2vl example guests through wasinn run ---------------------------


GEMMA3_TURN = "<start_of_turn>user\n<start_of_image>{image}<end_of_image>{text}<end_of_turn>\n<start_of_turn>model\n"
QWEN2VL_TURN = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
    "<|vision_start|>{image}<|vision_end|>{text}<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("photos")
    (folder / "red.png").write_bytes(RED)
    (folder / "blue.png").write_bytes(BLUE)
    return folder


@pytest.mark.parametrize("kind", ["gemma3", "qwen2vl"])
def test_wasmedge_vision_guest_answers_a_prompt_argument(
    kind: str, photos: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """WasmEdge's CI mode: the prompt (with ``<image>``) as an argument, metadata read before compute, the
    answer trimmed; no temp is sent, and the model's logits are wide enough that sampling is greedy.
    (A short prompt: in the chat template's long prompt this tiny random model hardly sees the image.)"""
    text, projector = write_vision_model(tmp_path, kind=kind)
    prompt = "ab <image> cd"
    answers: set[str] = set()

    def run(image: str) -> subprocess.CompletedProcess[str]:
        return wasinn_cli(
            f"--nn-preload=m:GGML:AUTO:{text}",
            f"--nn-mmproj=m:{projector}",
            f"--dir={photos}::/data",
            f"--env=image={image}",
            f"--env=mmproj={projector.name}",
            "--env=ctx_size=512",
            "--max-n-predict=8",
            f"guest_examples/{kind}.wasm",
            "m",
            prompt,
        )

    registry = ModelRegistry([Preload("m", text, mmproj=projector)])
    try:
        nn = WasiNN(registry=registry)
        for image, name in ((RED, "red"), (BLUE, "blue")):
            expected, n_input = answer(nn, f"ab {img_tag(image)} cd", "m")
            result = run(f"/data/{name}.png")
            assert result.returncode == 0, result.stderr
            assert result.stdout.startswith(f"Prompt:\n{prompt}\nResponse:\n[INFO] llama_commit: ")
            assert result.stdout.endswith(
                f"[INFO] Number of input tokens: {n_input}\n"  # read before compute: the image counted
                f"{expected.strip()}\n"
                f"[INFO] Number of input tokens: {n_input}\n"
                "[INFO] Number of output tokens: 8\n"
            )
            answers.add(expected)
        assert len(answers) == 2, "the image decides the answer"
    finally:
        registry.close()
    missing = wasinn_cli(f"--nn-preload=m:GGML:AUTO:{text}", f"guest_examples/{kind}.wasm", "m", "hi")
    assert (missing.returncode, missing.stderr.strip()) == (1, "Failed to get mmproj model.")


def test_wasmedge_command_line_names_the_projector_through_the_guests_directory(tmp_path: pathlib.Path) -> None:
    """WasmEdge's own command line, unchanged: the projector is the guest's ``mmproj`` file inside its
    preopened directory (no --nn-mmproj); files outside every preopened directory stay refused."""
    text, projector = write_vision_model(tmp_path, kind="qwen2vl")
    (tmp_path / "red.png").write_bytes(RED)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "escape.gguf").symlink_to(projector)  # a link out of the preopened sub/
    guest = str(pathlib.Path(__file__).resolve().parents[2] / "guest_examples" / "qwen2vl.wasm")
    prompt = "ab <image> cd"

    def wasmedge_style(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "wasinn_host", "run", *options, "--env", "image=red.png"]
            + ["--env", "ctx_size=512", "--max-n-predict=8", "--nn-preload", f"default:GGML:AUTO:{text.name}"]
            + [guest, "default", prompt],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=120,
        )

    registry = ModelRegistry([Preload("m", text, mmproj=projector)])
    try:
        expected, n_input = answer(WasiNN(registry=registry), f"ab {img_tag(RED)} cd", "m")
        with WasiNN(registry=ModelRegistry([Preload("m", text)])).session(
            "m", {**GREEDY, "mmproj": projector.name}, dirs=[(str(tmp_path), ".")]
        ) as session:
            assert session.complete(f"ab {img_tag(RED)} cd") == expected  # the embedding API the same way
    finally:
        registry.close()
    result = wasmedge_style("--dir", ".:.", "--env", f"mmproj={projector.name}")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(
        f"[INFO] Number of input tokens: {n_input}\n{expected.strip()}\n"
        f"[INFO] Number of input tokens: {n_input}\n[INFO] Number of output tokens: 8\n"
    ), result.stdout
    for mmproj, dirs in (
        (str(projector), ["--dir", "sub::/sub"]),  # a host path the guest was not given
        ("../" + projector.name, ["--dir", f"{tmp_path / 'sub'}::."]),  # out through ..
        ("/sub/escape.gguf", ["--dir", f"{tmp_path / 'sub'}::/sub"]),  # out through a link
    ):
        refused = wasmedge_style(*dirs, "--env", f"mmproj={mmproj}")
        assert refused.returncode == 1, refused.stderr
        assert f"config key 'mmproj': {mmproj!r} is not a file inside the guest's preopened directories" in (
            refused.stderr
        )
    fixed = wasmedge_style("--dir", ".:.", "--env", "mmproj=red.png", f"--nn-mmproj=default:{projector}")
    assert fixed.returncode == 1 and "is not the projector configured for 'default'" in fixed.stderr


@pytest.mark.parametrize("kind", ["gemma3", "qwen2vl"])
def test_wasmedge_vision_guest_chat_resends_the_conversation_with_the_image_from_the_kv_cache(
    kind: str, photos: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """The interactive mode: one stdin line per turn (blank lines skipped), the model's chat format with
    the image in the first turn, each answer appended with the end-of-turn text and the whole
    conversation sent again; the second turn keeps the first turn's cells, image included."""
    text, projector = write_vision_model(tmp_path, kind=kind)
    turn, next_turn, end = (
        (GEMMA3_TURN, "<start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n", "<end_of_turn>\n")
        if kind == "gemma3"
        else (QWEN2VL_TURN, "<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n")
    )
    result = wasinn_cli(
        f"--nn-preload=m:GGML:AUTO:{text}",
        f"--nn-mmproj=m:{projector}",
        f"--dir={photos}::/data",
        "--env=image=/data/red.png",
        f"--env=mmproj={projector}",
        "--env=ctx_size=512",
        "--max-n-predict=8",
        "--status",
        f"guest_examples/{kind}.wasm",
        "m",
        stdin="what is it?\n\nand the colour?\n",
    )
    assert result.returncode == 0, result.stderr
    registry = ModelRegistry([Preload("m", text, mmproj=projector)])
    try:
        nn = WasiNN(registry=registry)
        first = turn.format(image=img_tag(RED), text="what is it?")
        reply, n_first = answer(nn, first, "m")
        second = first + reply.strip() + end + next_turn.format(text="and the colour?")
        expected = ["USER:", "ASSISTANT:", reply.strip(), "USER:", "ASSISTANT:", answer(nn, second, "m")[0].strip()]
    finally:
        registry.close()
    assert result.stdout.splitlines() == [*expected, "USER:"]
    reused = int(result.stderr.split('"reused_prompt_tokens": ')[1].split(",")[0])
    assert reused >= n_first, "the second turn kept the first turn's text and image"


def test_vision_guests_over_rpc_send_the_guests_image_inline(
    qwen_nn: WasiNN, qwen_files: tuple[pathlib.Path, pathlib.Path], photos: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    """A server never reads a file a client names: the client reads the ``image`` key's file through the
    guest's ``--dir`` and sends it inline, and drops ``mmproj`` (the server's host chose the projector),
    so the guest gets the answer a local run gives."""
    text, projector = qwen_files
    registry = ModelRegistry([Preload("q", text, mmproj=projector)])
    server = NNServer(f"unix:{tmp_path / 'nn.sock'}", LocalBackend(registry, Limits(max_n_predict=8)))
    server.start()
    try:
        remote = WasiNN(rpc=f"unix://{tmp_path / 'nn.sock'}")
        dirs = [(str(photos), "/data")]
        for config in ({"image": "/data/blue.png"}, {"image": "/data/blue.png", "mmproj": "any.gguf"}):
            with remote.session("q", {**GREEDY, **config}, dirs=dirs) as session:
                assert session.complete("ab <image> cd") == answer(qwen_nn, f"ab {img_tag(BLUE)} cd")[0]
        with remote.session("q", {**GREEDY, "image": "/data/blue.png"}) as session:
            with pytest.raises(Exception, match="cannot read files"):
                session.complete("ab <image> cd")
        remote.close()
        result = wasinn_cli(
            f"--nn-rpc-uri=unix://{tmp_path / 'nn.sock'}",
            f"--dir={photos}::/data",
            "--env=image=/data/red.png",
            f"--env=mmproj={projector}",
            "--env=ctx_size=512",
            "guest_examples/qwen2vl.wasm",
            "q",
            "ab <image> cd",
        )
        assert result.returncode == 0, result.stderr
        assert (
            f"\n{answer(qwen_nn, f'ab {img_tag(RED)} cd')[0].strip()}\n[INFO] Number of input tokens" in result.stdout
        )
    finally:
        server.stop(1)
        registry.close()


def test_a_component_guest_reads_its_image_through_its_preopened_directories(
    qwen_nn: WasiNN, qwen_files: tuple[pathlib.Path, pathlib.Path], photos: pathlib.Path
) -> None:
    """The WIT front end resolves the ``image`` key (in the ``metadata`` tensor) as the core one does."""
    text, projector = qwen_files

    def run(image: str) -> subprocess.CompletedProcess[str]:
        return wasinn_cli(
            f"--nn-preload=q:GGML:AUTO:{text}",
            f"--nn-mmproj=q:{projector}",
            f"--dir={photos}::/data",
            "guest_examples/components/nn_complete.wasm",
            "q",
            "ab <image> cd",
            f'{{"temp": 0, "n-predict": 8, "image": "{image}"}}',
        )

    for image, name in ((RED, "red"), (BLUE, "blue")):
        result = run(f"/data/{name}.png")
        assert (result.returncode, result.stdout) == (0, answer(qwen_nn, f"ab {img_tag(image)} cd")[0] + "\n")
    outside = run("/etc/hostname")
    assert outside.returncode == 1 and "outside the guest's preopened directories" in outside.stderr
