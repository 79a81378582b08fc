"""Train the embedded demo model, a tiny llama that answers arithmetic in ChatML conversations.

Output: ``wasinn_host/models/demo-arith.gguf``, a llama.cpp model that greedy-decodes the answer to a
1-3 digit addition or subtraction question asked in the last user turn of a ChatML conversation
("What is 12+30?" or "12+30=" -> "42<|im_end|>"; "12-30=" -> "-18<|im_end|>"). Data, vocabulary and
held-out problems live in ``wasinn_host/testing/demo_data.py`` (shared with the tests).

Recipe
------
* Vocabulary: SPM ("llama") with byte fallback: ``<unk> <s> </s>``, ``<0x00>``..``<0xFF>``, ``▁`` (space)
  and one token per printable ASCII character, then ``<|im_start|>`` and ``<|im_end|>`` as CONTROL
  tokens; ``<|im_end|>`` is eos and eot. 356 tokens. Newline is the byte token ``<0x0A>``. Training
  sequences are ``<s>`` + ChatML text tokenized exactly as llama.cpp does (the eval checks this).
* Model: llama architecture, d=128, 3 layers, 4 heads (head dim 32), SwiGLU n_ff=384, RMSNorm eps 1e-5,
  RoPE base 10000 in llama.cpp's "normal" mode (adjacent pairs rotated), no biases, separate output
  matrix; 0.73 M parameters. The PyTorch forward pass below is llama.cpp's, so the exported weights
  need no permutation; the GGUF holds matrices in F16 and norms in F32 (1.5 MB), context length 512.
* Data (fresh random samples every step, seeded by (seed, step), so a resumed run sees the same data):
  conversations with an optional system message (``--p-system`` 40 %, 0-150 random characters:
  sentences, word salad or character noise), 0-3 earlier arithmetic turns (end token repeated in
  30 % of them, as clients write back generated text that includes it) and a final question, half
  "What is a+b?" and half "a+b=", operands 1-3 digits, "+" or "-". The loss covers every assistant
  answer and its first ``<|im_end|>``, so history turns are training examples too. Curriculum: the
  first ``--simple-steps`` (1500) steps use only one-question conversations without a system message
  (~30 tokens, cheap); afterwards 30 % stay that way. Final questions of the held-out slice (1/32 of
  all problems, ``is_held_out``) are never trained on.
* Batching: each step samples ``--batch`` (128) conversations, sorts them by length and runs them as
  ``--micro`` (8) length-bucketed micro-batches (little padding), accumulating gradients; about 4 k
  tokens per step in the curriculum, 11 k afterwards.
* Optimiser: AdamW (betas 0.9/0.98, weight decay 0.01 on matrices), peak LR 3e-3, 150 warm-up steps,
  cosine decay to 5 %, gradient clipping at 1.0. With ``--time-schedule`` the decay follows
  max(step/steps, elapsed/minutes), so a run cut short by ``--minutes`` still ends annealed.

Checkpoints go to ``--ckpt-dir`` (default ``/tmp/demo_arith_ckpt``) every ``--ckpt-minutes`` and on
exit; rerunning the same command resumes. Each periodic evaluation (PyTorch, greedy, ``--eval-n``
held-out prompts) that matches or beats the best so far re-exports the GGUF, so there is always a
usable file at ``--out``. At the end the best weights are exported, evaluated through
llama-cpp-python on ``--final-n`` held-out problems (``make_problems(n, seed=7)``) and compared, answer
for answer, with the PyTorch model holding the same F16-rounded weights.

Results of the shipped model (2-core AMD EPYC shared with other work; 1 torch thread, ``nice -n 10``)
----------------------------------------------------------------------------------------------------
Command: ``train_demo_model.py --minutes 100 --steps 6000 --time-schedule`` (seed 1234). The time
limit stopped it after 5,460 steps in 100 minutes (about 0.37 s/step in the curriculum, 1.2-1.6 s/step
after it); about 1.1 M answers seen. Held-out accuracy (PyTorch, 400 prompts) by step: 1500: 6 %
(right after the one-question curriculum; the loss had just dropped from a plateau near 1.0), 2000:
80 %, 2500: 89 %, 3000: 92 %, 3500: 94 %, 4000: 96 %, 4500: 98 %, 5000: 98 %, 5460: 99.25 %.
Final, through llama.cpp (greedy, BOS added, specials parsed): 99.0 % on 1,000 held-out prompts
(seed 7), 98.9 % on 3,000 (seed 2024); llama.cpp's greedy answers equal PyTorch's on all 1,000 and
its tokenization equals :func:`wasinn_host.testing.demo_data.encode` on every prompt. The remaining misses are
borrow digits in subtractions of close numbers (456-383 -> 83), not finding the question.
Because of ``--time-schedule`` the step count (hence the exact weights) depends on machine speed; the
same data and schedule are reproduced with ``--steps 5460`` and no ``--time-schedule`` only
approximately (the LR curve differs slightly).

Fine-tuning for the ChatML spellings clients use (the shipped file since then)
-----------------------------------------------------------------------------
The model above answered 1-2.5 % of held-out problems when the prompt ended ``<|im_start|>assistant``
without a newline (LlamaEdge's template) or had a space or newline after the question: it had learned
the answer's position relative to fixed offsets. It was fine-tuned from its GGUF (``--init-from``)
with ``--p-styles`` mixing :func:`~wasinn_host.testing.demo_data.random_style` spellings in, three
stages, each starting from the previous stage's export (2 torch threads, machine shared with test runs):

1. ``--seed 4321 --p-styles 0.7 --p-suffix 0.6 --simple-steps 0 --steps 1200 --lr 1e-3 --warmup 30``:
   the weakest spellings rose from 6 % to 54 % (PyTorch, 50 per spelling), standard 94-96 %.
2. ``--seed 5555 --p-styles 0.8 --p-suffix 0.7 --simple-steps 0 --lr 2.5e-3 --warmup 50``, 3,300 steps
   (the schedule was lengthened twice while it ran; its last part ``--steps 3600 --time-schedule
   --minutes 58``): stuck near 70 % until step ~2,200, then 96 % within 250 steps; through a guest
   95-98 % per spelling.
3. ``--seed 777 --p-styles 0.85 --p-suffix 0.7 --simple-steps 0 --steps 2500 --lr 1e-3 --warmup 30
   --time-schedule --minutes 45 --eval-n 800``: 97-99 % per spelling by step 1,500. The shipped file is
   the final (step 2,500, fully annealed) weights exported from the checkpoint: on 1,000 problems per
   spelling through llama.cpp (seed 7) it scores 98.0-99.2 % on every spelling, above the step-2,100
   weights the periodic evaluation had kept (97.8-99.0 %).

Through ``complete.wasm`` (``tests/e2e/test_demo_model.py``, 200 problems per spelling, seed 2026):
standard 98.5 %, no newline after ``assistant`` 98.5 %, system message 99.5 %, none 98.5 %, repeated
end token in history 99.0 %, single 99.0 %, space after the question 97.5 %, newline after it 97.5 %.
The misses are still borrow digits (127-98 -> 39). Same shape and size (0.73 M parameters, 1.5 MB).

Usage::

    nohup nice -n 10 python scripts/training/train_demo_model.py --minutes 100 --steps 6000 --time-schedule \
        > /tmp/train_demo.log 2>&1 &
    python scripts/training/eval_demo_model.py -n 1000
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import random
import sys
import time
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import wasinn_host.testing.demo_data as demo
from wasinn_host.testing.gguf_models import LlamaShape, Vocab, write_llama_gguf

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "wasinn_host" / "models" / "demo-arith.gguf"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = demo.VOCAB_SIZE
    dim: int = 128
    n_layers: int = 3
    n_heads: int = 4
    n_ff: int = 384
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    context_length: int = demo.CONTEXT_LENGTH

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads


# --------------------------------------------------------------------------------------------------
# Model: llama.cpp's llama forward pass.
# --------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x^2) + eps) * weight, as one kernel.
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_table(cfg: ModelConfig, n_pos: int) -> torch.Tensor:
    """Complex rotations [n_pos, head_dim/2]: pair i at position p turns by p * base^(-2i/head_dim)."""
    inv = cfg.rope_base ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
    ang = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.polar(torch.ones_like(ang), ang).to(torch.complex64)


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """llama.cpp ROPE_TYPE_NORM: rotate adjacent pairs (x[2i], x[2i+1]); x: [B, T, H, D].

    Viewing each adjacent pair as a complex number x[2i] + i*x[2i+1], the rotation is one complex
    product: (x0*cos - x1*sin, x0*sin + x1*cos).
    """
    xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(xc * rot[None, :, None, :]).flatten(-2)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, ff = cfg.dim, cfg.n_ff
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.w_gate = nn.Linear(d, ff, bias=False)
        self.w_up = nn.Linear(d, ff, bias=False)
        self.w_down = nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h, hd = self.cfg.n_heads, self.cfg.head_dim
        y = self.attn_norm(x)
        q = apply_rope(self.wq(y).view(b, t, h, hd), rot).transpose(1, 2)
        k = apply_rope(self.wk(y).view(b, t, h, hd), rot).transpose(1, 2)
        v = self.wv(y).view(b, t, h, hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, -1))
        y = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(y)) * self.w_up(y))


class TinyLlama(nn.Module):
    rope: torch.Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embd = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.output_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("rope", rope_table(cfg, cfg.context_length), persistent=False)
        self.apply(self._init)
        for blk in self.blocks():  # scaled init of residual projections
            nn.init.normal_(blk.wo.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))
            nn.init.normal_(blk.w_down.weight, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def blocks(self) -> list[Block]:
        """The transformer blocks, typed."""
        return [cast(Block, blk) for blk in self.layers]

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """Final hidden states [B, T, dim] before the output norm."""
        rot = self.rope[: ids.shape[1]]
        x = self.tok_embd(ids)
        for blk in self.blocks():
            x = blk(x, rot)
        return x

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.output(self.output_norm(h))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.logits(self.hidden(ids))


# --------------------------------------------------------------------------------------------------
# Data.
# --------------------------------------------------------------------------------------------------


def encode_conversation(conv: demo.Conversation) -> tuple[list[int], list[bool]]:
    """Token ids (BOS first) and, per position, whether that token is a training target."""
    ids = [demo.BOS_ID]
    target = [False]
    for text, is_target in zip(conv.segments, conv.targets):
        seg = demo.encode(text, add_bos=False)
        ids += seg
        target += [is_target] * len(seg)
    return ids, target


def make_step_batches(
    step: int,
    seed: int,
    batch: int,
    micro: int,
    simple_steps: int,
    p_simple: float,
    p_system: float,
    p_styles: float = 0.0,
    p_suffix: float = 0.3,
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Micro-batches (inputs, targets, loss mask) for one optimiser step, length-bucketed; with
    ``p_styles`` > 0 that share of conversations is spelled in a random client style
    (:func:`demo.random_style`), ``p_suffix`` of those with a space or newline after the question."""
    rng = random.Random(seed * 1_000_003 + step)
    p = 1.0 if step < simple_steps else p_simple

    def style() -> demo.Style:
        return demo.random_style(rng, p_suffix=p_suffix) if p_styles and rng.random() < p_styles else demo.Style()

    docs = [
        encode_conversation(demo.sample_conversation(rng, p_system=p_system, p_simple=p, style=style()))
        for _ in range(batch)
    ]
    docs.sort(key=lambda d: len(d[0]))
    out = []
    per = math.ceil(batch / micro)
    for i in range(0, batch, per):
        chunk = docs[i : i + per]
        t = max(len(ids) for ids, _ in chunk) - 1
        x = torch.zeros(len(chunk), t, dtype=torch.long)
        y = torch.zeros(len(chunk), t, dtype=torch.long)
        m = torch.zeros(len(chunk), t, dtype=torch.bool)
        for j, (ids, tgt) in enumerate(chunk):
            n = len(ids) - 1
            x[j, :n] = torch.tensor(ids[:-1])
            y[j, :n] = torch.tensor(ids[1:])
            m[j, :n] = torch.tensor(tgt[1:])
        out.append((x, y, m))
    return out


# --------------------------------------------------------------------------------------------------
# Greedy evaluation in PyTorch.
# --------------------------------------------------------------------------------------------------


@torch.no_grad()
def greedy_answers(model: TinyLlama, prompts: Sequence[str], max_new: int = 6, chunk: int = 64) -> list[str]:
    """Greedy completions (end token stripped) of each prompt, BOS added, like the GGUF eval does."""
    model.eval()
    enc = [demo.encode(p) for p in prompts]
    order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
    out: list[str] = [""] * len(enc)
    eog = {demo.IM_END_ID, demo.TOKEN_ID["</s>"]}
    for s in range(0, len(order), chunk):
        idx = order[s : s + chunk]
        seqs = [list(enc[i]) for i in idx]
        gen: list[list[int]] = [[] for _ in idx]
        done = [False] * len(idx)
        for _ in range(max_new):
            t = max(len(q) for q in seqs)
            x = torch.zeros(len(seqs), t, dtype=torch.long)
            for j, q in enumerate(seqs):
                x[j, : len(q)] = torch.tensor(q)
            logits = model(x)
            for j, q in enumerate(seqs):
                if done[j]:
                    continue
                tok = int(logits[j, len(q) - 1].argmax())
                if tok in eog:
                    done[j] = True
                else:
                    gen[j].append(tok)
                    q.append(tok)
            if all(done):
                break
        for j, i in enumerate(idx):
            out[i] = demo.decode(gen[j])
    model.train()
    return out


def accuracy(answers: Sequence[str], problems: Sequence[tuple[str, str]]) -> float:
    return sum(a == e for a, (_, e) in zip(answers, problems)) / max(len(problems), 1)


# --------------------------------------------------------------------------------------------------
# GGUF export.
# --------------------------------------------------------------------------------------------------


def export_gguf(model: TinyLlama, path: pathlib.Path) -> None:
    """Write the model as a llama.cpp GGUF (F16 matrices, F32 norms), atomically."""
    cfg = model.cfg
    shape = LlamaShape(
        n_vocab=cfg.vocab_size,
        n_embd=cfg.dim,
        n_layer=cfg.n_layers,
        n_head=cfg.n_heads,
        n_ff=cfg.n_ff,
        context_length=cfg.context_length,
        rms_eps=cfg.norm_eps,
        rope_base=cfg.rope_base,
    )
    scores = [0.0 if t != demo.TOKEN_TYPE_NORMAL else -float(i) for i, t in enumerate(demo.TOKEN_TYPES)]
    vocab = Vocab(
        demo.TOKENS,
        scores,
        demo.TOKEN_TYPES,
        bos_id=demo.BOS_ID,
        eos_id=demo.EOS_ID,
        unk_id=demo.UNK_ID,
        eot_id=demo.IM_END_ID,
    )

    def weights(t: torch.Tensor) -> np.ndarray:
        return t.detach().cpu().numpy().astype(np.float32)

    tensors = {"token_embd.weight": weights(model.tok_embd.weight)}
    for i, blk in enumerate(model.blocks()):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = weights(blk.attn_norm.weight)
        tensors[p + "attn_q.weight"] = weights(blk.wq.weight)
        tensors[p + "attn_k.weight"] = weights(blk.wk.weight)
        tensors[p + "attn_v.weight"] = weights(blk.wv.weight)
        tensors[p + "attn_output.weight"] = weights(blk.wo.weight)
        tensors[p + "ffn_norm.weight"] = weights(blk.ffn_norm.weight)
        tensors[p + "ffn_gate.weight"] = weights(blk.w_gate.weight)
        tensors[p + "ffn_up.weight"] = weights(blk.w_up.weight)
        tensors[p + "ffn_down.weight"] = weights(blk.w_down.weight)
    tensors["output_norm.weight"] = weights(model.output_norm.weight)
    tensors["output.weight"] = weights(model.output.weight)
    write_llama_gguf(
        path,
        shape,
        vocab,
        tensors,
        name="wasinn-demo-arith",
        f16=True,
        description="Tiny arithmetic demo model for wasinn-host (scripts/training/train_demo_model.py)",
        chat_template=demo.CHAT_TEMPLATE,
    )


def load_gguf(model: TinyLlama, path: pathlib.Path) -> None:
    """Load weights written by :func:`export_gguf` (the inverse mapping) into ``model``."""
    from gguf import GGUFReader

    tensors = {t.name: torch.from_numpy(np.array(t.data, dtype=np.float32)) for t in GGUFReader(path).tensors}
    targets = {
        "token_embd.weight": model.tok_embd.weight,
        "output_norm.weight": model.output_norm.weight,
        "output.weight": model.output.weight,
    }
    for i, blk in enumerate(model.blocks()):
        p = f"blk.{i}."
        targets |= {
            p + "attn_norm.weight": blk.attn_norm.weight,
            p + "attn_q.weight": blk.wq.weight,
            p + "attn_k.weight": blk.wk.weight,
            p + "attn_v.weight": blk.wv.weight,
            p + "attn_output.weight": blk.wo.weight,
            p + "ffn_norm.weight": blk.ffn_norm.weight,
            p + "ffn_gate.weight": blk.w_gate.weight,
            p + "ffn_up.weight": blk.w_up.weight,
            p + "ffn_down.weight": blk.w_down.weight,
        }
    with torch.no_grad():
        for name, param in targets.items():
            param.copy_(tensors[name].reshape(param.shape))


def f16_rounded(model: TinyLlama) -> TinyLlama:
    """A copy whose matrices are rounded to F16 as in the GGUF (norms stay F32)."""
    clone = TinyLlama(model.cfg)
    clone.load_state_dict(model.state_dict())
    with torch.no_grad():
        for name, p in clone.named_parameters():
            if "norm" not in name:
                p.copy_(p.half().float())
    return clone


# --------------------------------------------------------------------------------------------------
# Training loop.
# --------------------------------------------------------------------------------------------------


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def save_checkpoint(path: pathlib.Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="GGUF to write")
    ap.add_argument("--ckpt-dir", type=pathlib.Path, default=pathlib.Path("/tmp/demo_arith_ckpt"))
    ap.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    ap.add_argument("--minutes", type=float, default=90.0, help="wall-clock limit for training")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=6000, help="optimiser steps (LR schedule length)")
    ap.add_argument("--simple-steps", type=int, default=1500, help="bare-conversation curriculum")
    ap.add_argument("--p-simple", type=float, default=0.3, help="bare share after the curriculum")
    ap.add_argument("--p-system", type=float, default=0.4, help="share with a system message")
    ap.add_argument("--batch", type=int, default=128, help="conversations per step")
    ap.add_argument("--micro", type=int, default=8, help="length buckets (micro-batches) per step")
    ap.add_argument(
        "--time-schedule",
        action="store_true",
        help="decay the LR by max(step/steps, elapsed/minutes), so a run cut by --minutes still "
        "ends annealed (not bit-reproducible: the step count then depends on machine speed)",
    )
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ff", type=int, default=384)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--eval-n", type=int, default=400, help="held-out problems per periodic eval")
    ap.add_argument("--final-n", type=int, default=1000, help="held-out problems for the final eval")
    ap.add_argument("--ckpt-minutes", type=float, default=3.0)
    ap.add_argument("--bench", type=int, default=0, help="only time this many steps and exit")
    ap.add_argument("--init-from", type=pathlib.Path, help="start from this GGUF's weights (fine-tuning)")
    ap.add_argument(
        "--stop-after", type=int, default=0, help="stop after this many steps, keeping the --steps LR schedule"
    )
    ap.add_argument(
        "--p-styles", type=float, default=0.0, help="share of conversations spelled in a random client style"
    )
    ap.add_argument(
        "--p-suffix",
        type=float,
        default=0.3,
        help="share of client-style conversations with a space or newline after the question",
    )
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = ModelConfig(dim=args.dim, n_layers=args.layers, n_heads=args.heads, n_ff=args.ff)
    model = TinyLlama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.98),
    )
    print(f"config {cfg} params {n_params / 1e6:.3f} M; args {vars(args)}", flush=True)

    if args.init_from:
        load_gguf(model, args.init_from)
        print(f"initialised from {args.init_from}", flush=True)
    ckpt = args.ckpt_dir / "last.pt"
    step, best_acc, trained_s = 0, -1.0, 0.0
    best_state: dict | None = None
    if ckpt.exists() and not args.no_resume and not args.bench:
        state = torch.load(ckpt, weights_only=False)
        if state["cfg"] == dataclasses.asdict(cfg):
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            step, best_acc, trained_s = state["step"], state["best_acc"], state["trained_s"]
            best_state = state.get("best_model")
            print(f"resumed at step {step} (best acc {best_acc:.4f}, {trained_s / 60:.1f} min)")
        else:
            print("checkpoint has another model shape; starting fresh")

    def checkpoint() -> None:
        save_checkpoint(
            ckpt,
            {
                "cfg": dataclasses.asdict(cfg),
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
                "best_acc": best_acc,
                "best_model": best_state,
                "trained_s": time.time() - start,
                "args": vars(args),
            },
        )

    per_variant = max(1, args.eval_n // len(demo.VARIANTS)) if args.p_styles else args.eval_n
    eval_sets = {
        name: demo.make_problems(per_variant, seed=args.seed + 1, style=style)
        for name, style in (demo.VARIANTS.items() if args.p_styles else [("standard", demo.Style())])
    }

    def held_out_accuracy() -> float:
        """The lowest accuracy over the evaluated spellings (each printed)."""
        scores = {name: accuracy(greedy_answers(model, [p for p, _ in ps]), ps) for name, ps in eval_sets.items()}
        if len(scores) > 1:
            print("  " + ", ".join(f"{name} {acc:.3f}" for name, acc in scores.items()), flush=True)
        return min(scores.values())

    start = time.time() - trained_s
    last_ckpt = time.time()
    loss_acc, tok_acc, t_log = 0.0, 0, time.time()
    model.train()
    while step < (min(args.steps, args.stop_after) if args.stop_after else args.steps):
        if time.time() - start > args.minutes * 60:
            print(f"time limit reached at step {step}", flush=True)
            break
        sched_step = step
        if args.time_schedule:
            frac = (time.time() - start) / (args.minutes * 60)
            sched_step = max(step, int(frac * args.steps))
        for g in opt.param_groups:
            g["lr"] = lr_at(sched_step, args.steps, args.lr, args.warmup)
        batches = make_step_batches(
            step,
            args.seed,
            args.batch,
            args.micro,
            args.simple_steps,
            args.p_simple,
            args.p_system,
            args.p_styles,
            args.p_suffix,
        )
        n_tgt = sum(int(m.sum()) for _, _, m in batches)
        opt.zero_grad(set_to_none=True)
        for x, y, m in batches:
            logits = model.logits(model.hidden(x)[m])  # output layer only where there is a target
            loss = F.cross_entropy(logits, y[m], reduction="sum") / n_tgt
            loss.backward()
            loss_acc += float(loss.detach()) * n_tgt
        tok_acc += n_tgt
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1

        if args.bench and step >= args.bench:
            dt = time.time() - t_log
            print(f"bench: {dt / step * 1000:.0f} ms/step, loss {loss_acc / tok_acc:.3f}")
            return 0
        if step % 50 == 0:
            now = time.time()
            print(
                f"step {step} loss {loss_acc / max(tok_acc, 1):.4f} lr {opt.param_groups[0]['lr']:.2e} "
                f"{(now - t_log) / 50 * 1000:.0f} ms/step elapsed {(now - start) / 60:.1f} min",
                flush=True,
            )
            loss_acc, tok_acc, t_log = 0.0, 0, now
        if step % args.eval_every == 0 or step == args.steps:
            acc = held_out_accuracy()
            print(f"eval step {step}: held-out accuracy {acc:.4f} (n={per_variant} per spelling)", flush=True)
            if acc >= best_acc:  # on a tie prefer the later, more annealed weights
                best_acc = acc
                best_state = {k: v.clone() for k, v in model.state_dict().items()}
                try:
                    export_gguf(model, args.out)
                    print(f"  exported {args.out}", flush=True)
                except Exception as exc:  # keep training; the final export runs again
                    print(f"  GGUF export failed: {exc!r}", flush=True)
            t_log = time.time()
        if time.time() - last_ckpt > args.ckpt_minutes * 60 or step == args.steps:
            checkpoint()
            last_ckpt = time.time()
    checkpoint()

    # Final: evaluate the last weights on the periodic set, keep whichever is best, then check the
    # exported GGUF through llama.cpp against the F16-rounded PyTorch model on fresh problems.
    acc = held_out_accuracy()
    print(f"final step {step}: held-out accuracy {acc:.4f}", flush=True)
    if acc >= best_acc or best_state is None:
        best_acc, best_state = acc, {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    export_gguf(model, args.out)
    print(f"training took {(time.time() - start) / 60:.1f} min, {step} steps; wrote {args.out}")

    problems = demo.make_problems(args.final_n, seed=7)
    torch_answers = greedy_answers(f16_rounded(model), [p for p, _ in problems])
    print(f"PyTorch (F16 weights) accuracy {accuracy(torch_answers, problems):.4f} (n={len(problems)})")
    try:
        res = demo.eval_gguf(args.out, problems, threads=args.threads)
    except ImportError as exc:
        print(f"llama_cpp unavailable, skipping GGUF eval: {exc}")
        return 0
    same = sum(a == b for a, b in zip(torch_answers, res.outputs))
    print(
        f"llama.cpp accuracy {res.accuracy:.4f} ({res.correct}/{res.total}), "
        f"same greedy answers as PyTorch on {same}/{res.total}, "
        f"tokenizer mismatches {res.tokenizer_mismatches}, {res.seconds:.1f}s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
