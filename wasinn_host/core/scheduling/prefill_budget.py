"""Chunked prefill: how many prompt tokens one step takes while other guests are generating.

A step that carries hundreds of prompt tokens costs, on a CPU, as much as dozens of plain decode
steps, and every generating guest waits for it.  So while guests generate, a step's prompt tokens are
limited to what keeps the step within ``multiple`` times the cost of the same step without them (the
``prefill-step-budget`` load-time key; 0 turns the limit off), by the worker's own cost model
(:class:`~.step_cost.StepCost`: passes, tokens and the KV cells they attend, each row class of pass
at its own price, fitted to its decodes), so a chunk late in a long prompt, whose tokens attend more
cells, is smaller than an early one, and a chunk is sized so that llama.cpp runs it in a pass of a
class that costs what its work does (:func:`_most_within`; where only chunks of a class twice as dear
per token or more fit, the step takes the smallest chunk of the cheap class instead, up to half over
the limit).  On a GPU, where a token costs little
beside a pass over the weights, the limit lets whole batches through; on a CPU it cuts a long prompt
into chunks of a few dozen tokens.  When nobody generates, prompts take the whole batch.

"Generating" means a job with one token to decode (its next token), and also a stream between two of
its steps: a ``compute_single`` stream is one request per token, so for a moment after each token its
guest has no request in the worker; :class:`PausedStreams` remembers such streams (while they keep their
sequence) for :data:`STREAM_PAUSE_S` so that a long prompt does not take the whole batch in that moment.
And a step with prompt tokens waits for paused streams to come back (at most twice their usual round
trip, at most :data:`MAX_HOLD_S`): without the wait the worker would run a step of prompt tokens alone
while their guests ask for the next token, and each of them would wait for two steps instead of one.

When more guests wait for their prompts than generate (eight guests sharing a system prompt: one
generating, seven decoding their own questions after copying the shared part), there is no limit: the
many waiting for a first token are not held back for the few generating.  Under the limit, prompt chunks
go to the highest ``priority`` first, then to the earliest request (the
queue's order); the first of them always gets at least :data:`MIN_PROMPT_TOKENS`, so no prompt waits
forever whatever the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from ..config.params import DEFAULT_STEP_BUDGET as DEFAULT_STEP_BUDGET  # the key's default: config/params.py
from .draft_budget import passes
from .step_cost import Entry, StepCost, attended, batch_cells, row_class

STREAM_PAUSE_S = 0.5
"""A stream whose last step ended this recently (and did not end the stream) still counts as generating."""
MIN_PROMPT_TOKENS = 1
"""Prompt tokens the first prompt in line takes in every step, whatever the budget."""
MIN_FIT_DECODES = 16
"""Before its worker has made this many decodes, the budget takes a token to cost as much as a pass
(the cost model's prior): a fit to a handful of decodes may say tokens are free."""
CHEAPER_CLASS = 2.0
"""How many times cheaper per token a larger row class's chunk must be for a step to go over its limit
to take it (:func:`_most_within`) ...

Flash attention's scalar loop (2-63 rows a sequence) against its tiled pass (64 and more), a prompt at
position 2,000 on 2-core CPUs: 16 rows 324 ms and 64 rows 182 ms on an Intel Xeon with AMX (7x dearer a
token), 176 ms and 209 ms on an AMD EPYC with AVX2 (3.4x).  With 4 the AMD machine never took the
tiled pass late in a long prompt: chunks of 7-15 rows carried its last thousand tokens (mixed-load
benchmark: llama.cpp's time 1.5-2.4x the same tokens decoded apart, the streams' median gap up to 4x
theirs alone)."""
OVER_LIMIT = 0.5
"""... and by how much of the limit at most (a quarter stopped 64-row chunks at position 1,500 on the
AMD machine above, where they cost 190-225 ms beside a 25 ms plain step and a budget of 7: the rest of
the prompt went in chunks of 7 rows at 10-17 ms a token)."""
EXPLORE_NEAR = 0.75
"""A take at least this share of the next row class's edge tries that class when no decode has priced it
(:func:`_cheaper_class`)."""
MAX_HOLD_S = 0.01
"""The longest a step with prompt tokens waits for paused streams to ask for their next token."""


class PausedStreams:
    """Streams between two steps: their context states, with when their last token was sampled, and how
    long their guests take to ask for the next one."""

    def __init__(self, window_s: float = STREAM_PAUSE_S) -> None:
        self.window_s = window_s
        self.roundtrip_s = 0.0
        """A decayed average of the time from a stream's token to its next request."""
        self._last: dict[object, float] = {}
        self._late: set[object] = set()

    def stepped(self, state: object, now: float, goes_on: bool) -> None:
        """A stream's step ended at ``now``; ``goes_on``: the stream continues (its next step will come)."""
        self._late.discard(state)
        if goes_on:
            self._last[state] = now
        else:
            self._last.pop(state, None)

    def lost_sequence(self, state: object) -> None:
        """The stream's sequence went to another context: its next step decodes its tokens again (a
        prompt, not a token of a generating guest), so it no longer counts as generating."""
        self.stepped(state, 0.0, goes_on=False)

    def arrived(self, state: object, now: float) -> None:
        """A request of ``state`` reached the worker at ``now`` (its stream's next step, if it is paused)."""
        last = self._last.get(state)
        if last is not None and now - last <= self.window_s:
            sample = now - last
            self.roundtrip_s = sample if not self.roundtrip_s else 0.8 * self.roundtrip_s + 0.2 * sample

    def count(self, now: float, running: Collection[object]) -> int:
        """Streams that stepped within the window and have no request ``running`` now (forgets older ones)."""
        for state in [s for s, t in self._last.items() if now - t > self.window_s]:
            del self._last[state]
            self._late.discard(state)
        return sum(1 for state in self._last if state not in running)

    def is_paused(self, state: object, now: float) -> bool:
        """``state`` is a stream between two steps (its last step within the window)."""
        last = self._last.get(state)
        return last is not None and now - last <= self.window_s

    def awaited(self, now: float, here: Collection[object]) -> list[object]:
        """Paused streams worth waiting for: without a request ``here``, and not late (see :meth:`late`)."""
        self.count(now, here)
        return [state for state in self._last if state not in here and state not in self._late]

    def late(self, states: Collection[object]) -> None:
        """These streams did not come back within a wait: no step waits for them again before their next
        token (they still count as generating for the budget until the window passes)."""
        self._late.update(states)

    def hold_s(self) -> float:
        """How long a step with prompt tokens waits for paused streams to come back: twice their usual
        round trip, at most :data:`MAX_HOLD_S`."""
        return min(2.0 * self.roundtrip_s, MAX_HOLD_S)


def step_limit(
    generating: Sequence[Entry], paused: int, cost: StepCost, multiple: float, prompts: int = 0
) -> float | None:
    """The most a step may cost (in the units of ``cost``) when ``generating`` ``(sequence id, tokens,
    position)`` (in id order) decode in it, ``paused`` more streams are between steps and ``prompts``
    guests wait for their prompts: ``multiple`` plain steps of the generating guests (a paused stream
    counted as one token in the same pass, at the generating guests' mean position; priced as a plain
    step, :meth:`.StepCost.plain_seconds`).  None: no limit, when it is off, nobody generates, or more
    guests wait for their prompts than generate (the few generating are not favoured over the many
    waiting for a first token)."""
    n_tokens = sum(n for _, n, _ in generating) + paused
    if multiple <= 0 or n_tokens == 0 or prompts > len(generating) + paused:
        return None
    mean_start = sum(start for _, _, start in generating) // len(generating) if generating else 0
    cells = batch_cells(generating) + paused * attended(1, mean_start)
    n_passes = max(1, passes([(seq, n) for seq, n, _ in generating]))
    return multiple * cost.plain_seconds(n_tokens, n_passes, cells)


def _most_within(base: list[Entry], chunks: list[Entry], prompt: Entry, cost: StepCost, limit: float) -> int:
    """How many of the ``prompt``'s tokens to take in the step of the generating ``base`` and the prompt
    ``chunks`` planned so far, the step within ``limit`` (:meth:`.StepCost.step_seconds`).  A step's
    cost grows with its tokens, passes and cells within a row class of the prompt's pass
    (:func:`.step_cost.row_class`), not across them: a larger chunk may cost less than a smaller one.
    So each class's range is searched on its own for the largest take within the limit, and of those
    the one that decodes the most prompt tokens per second of the step is taken (the largest of equals):
    where a class's passes cost several times another's, a chunk of the cheaper class, even a smaller
    one, brings the prompt's first token sooner.  0 if no take fits.  (A class whose largest take over
    the step without the prompt is no better than the best rate found is not searched, nor those below.)

    And where a class above the chosen take's costs the prompt a :data:`CHEAPER_CLASS` th of its cost
    per token or less (the step's own cost aside), the smallest take of that class is made instead, over
    the limit by :data:`OVER_LIMIT` of it at most: late in a long prompt on a CPU, a chunk of a few dozen
    rows runs through flash attention's scalar loop and costs as much as 64 rows in its tiled path
    (measured: 7 rows at position 2,000 145 ms, 15 rows 272 ms, 65 rows 230 ms, beside seven streams'
    30 ms), so the small chunk would cost the streams as long a step for a fifth of the prompt's
    progress, and llama.cpp many such steps."""
    seq_id, most, start = prompt

    def seconds(take: int) -> float:
        return cost.step_seconds(base, [*chunks, (seq_id, take, start)])[0]

    def fits(take: int) -> bool:
        return seconds(take) <= limit * (1 + 1e-9)  # not rounding's victim

    best, best_rate = 0, 0.0
    alone = max(seconds(0), 1e-12)
    top = most
    while top > 0 and top / alone > best_rate:  # (no take of a smaller class can decode more a second)
        low_edge = 1 << row_class(top)  # the smallest take of top's row class
        low = top if fits(top) else 0
        for edge in (low_edge, low_edge + 1):  # (a chunk decoded beside streams: its first row rides in theirs)
            if low or edge >= top:
                break
            if fits(edge):
                low, high = edge, top - 1
                while low < high:
                    mid = (low + high + 1) // 2
                    if fits(mid):
                        low = mid
                    else:
                        high = mid - 1
        if low:
            rate = low / max(seconds(low), 1e-12)
            if rate > best_rate * (1 + 1e-9):
                best, best_rate = low, rate
        top = low_edge - 1
    ceiling = limit * (1.0 + OVER_LIMIT)
    return _cheaper_class(best, most, seconds, ceiling, cost.knows, cost.classed_fit() is not None)


def _cheaper_class(
    take: int,
    most: int,
    seconds: Callable[[int], float],
    ceiling: float,
    known: Callable[[int], bool],
    classed: bool = False,
) -> int:
    """The smallest take above ``take`` (and at most ``most``) at a row class's edge whose step costs at
    most ``ceiling`` and whose tokens cost at most :data:`CHEAPER_CLASS` th of ``take``'s each beyond the
    step without the prompt (``seconds`` of a take), by a price the decodes have shown (``known``: of a
    pass of that many rows, not the pooled fit's guess); ``take`` if none does.

    And where the per-class fit prices classes (``classed``) but not the next one above ``take``, and
    ``take`` is at least :data:`EXPLORE_NEAR` of that class's edge, the edge is tried (one row over it, so
    that the pass is of that class even when the chunk's first row rides in the generating sequences'
    pass) if it fits ``ceiling``: otherwise a long prompt whose first chunks were cut just under 64 rows
    never learns what 64 cost, and goes on in the scalar class with chunks ever smaller (seen: chunks of
    63 rows, then of 15 for the rest of a 2,300-token prompt, 29 s to its first token against 7)."""
    if take <= 0:
        return take
    alone = seconds(0)
    per_token = (seconds(take) - alone) / take
    low_edge = 1 << row_class(take)
    while low_edge * 2 <= most:
        low_edge *= 2
        if classed and not known(low_edge) and take >= EXPLORE_NEAR * low_edge:
            edge = min(low_edge + 1, most)
            if seconds(edge) <= ceiling:
                return edge
        for edge in (low_edge, low_edge + 1):
            if edge > most or not known(edge) or (step := seconds(edge)) > ceiling:
                continue
            if (step - alone) / edge * CHEAPER_CLASS <= per_token:
                return edge
    return take


def prompt_takes(
    base: Sequence[Entry],
    prompts: Sequence[Entry],
    capacity: int,
    cost: StepCost,
    limit: float | None,
) -> list[int]:
    """Tokens each prompt ``(sequence id, tokens pending, position of the next)`` takes, in the order
    given, after the batch ``base`` ``(sequence id, tokens, position)``: as many as fit the ``capacity``
    left in the batch and, with a ``limit``, keep the step's estimated cost within it (the first prompt
    at least :data:`MIN_PROMPT_TOKENS`); a prompt the limit cut leaves nothing to those after it (a
    chunk may stop at a row class's edge below the limit: what is left is not theirs to take)."""
    entries = [entry for entry in base if entry[1] > 0]
    chunks: list[Entry] = []
    takes: list[int] = []
    left = capacity
    cut = False
    for seq_id, pending, start in prompts:
        take = 0 if cut else min(pending, left)
        if limit is not None and take > 0:
            floor = min(take, MIN_PROMPT_TOKENS) if not any(takes) else 0
            most = take
            take = max(_most_within(entries, chunks, (seq_id, take, start), cost, limit), floor)
            cut = take < most  # the limit stopped this prompt: none after it goes first
        takes.append(take)
        left -= take
        if take > 0:
            chunks.append((seq_id, take, start))
    return takes
