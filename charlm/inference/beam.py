"""Beam search: the most probable continuation of a prime, each beam carrying its own recurrent state.

A continuation is scored by its log probability under the model (natural log, temperature 1,
nothing filtered) divided by its length to the power ``length_penalty`` (alpha). Every
continuation has the asked-for length unless a stop string ends it early, so alpha only decides
between continuations of different lengths: 1 ranks them per symbol (bits per symbol), 0 by their
total probability (which favours ending early).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Sequence

import torch

from charlm.config_inference import SampleConfig
from charlm.errors import CharlmError, ConfigError
from charlm.model import LanguageModel

# Settings that shape random draws, with the value that leaves them off, and why beam search refuses them.
SAMPLING_ONLY = {
    "temperature": (1.0, "does not apply to beam search, which ranks continuations by the model's own probabilities"),
    "top_k": (0, "does not apply to beam search, which ranks continuations by the model's own probabilities"),
    "top_p": (1.0, "does not apply to beam search, which ranks continuations by the model's own probabilities"),
    "seed": (None, "does not apply to beam search, which draws nothing at random"),
    "num_samples": (1, "must be 1 with beam search: it gives the one most probable continuation"),
}


def check_beam_settings(config: SampleConfig) -> None:
    """Refuse the settings that make no sense together with (or without) a beam width."""
    if config.beam == 0:
        if config.length_penalty != SampleConfig.length_penalty:
            raise ConfigError(SampleConfig, "length_penalty", "applies only to beam search: give a beam width too")
        return
    for name, (off, reason) in SAMPLING_ONLY.items():
        if getattr(config, name) != off:
            raise ConfigError(SampleConfig, name, reason)


def normalised_score(log_prob: float, length: int, length_penalty: float) -> float:
    """``log_prob / length ** length_penalty`` (an empty continuation scores 0)."""
    if not length:
        return 0.0
    try:
        return log_prob / length**length_penalty
    except OverflowError:  # length ** alpha beyond a float (alpha 1e308): the score is log_prob / inf
        return log_prob / math.inf


@dataclasses.dataclass
class Beam:
    """One continuation: its token ids and each one's natural-log probability given what precedes it."""

    ids: list[int]
    log_probs: list[float]

    @property
    def log_prob(self) -> float:
        return math.fsum(self.log_probs)

    def score(self, length_penalty: float) -> float:
        return normalised_score(self.log_prob, len(self.ids), length_penalty)


def select_rows(state, index: torch.Tensor):
    """``state`` (tensors nested in lists and tuples, batch first) with the rows ``index`` picks."""
    if isinstance(state, torch.Tensor):
        return state.index_select(0, index)
    return type(state)(select_rows(part, index) for part in state)


@torch.inference_mode()
def beam_search(
    model: LanguageModel,
    prime_ids: Sequence[int],
    length: int,
    width: int,
    length_penalty: float = 1.0,
    banned_ids: Sequence[int] = (),
    finished: Callable[[list[int]], bool] | None = None,
) -> Beam:
    """The best-scoring continuation of ``prime_ids`` that a beam of ``width`` finds.

    At each step every live beam is extended by every symbol (except ``banned_ids``: the unknown
    entry, which stands for no character), and the ``width`` most probable extensions stay live,
    each with its own state. An extension for which ``finished(ids)`` is true (a stop string was
    generated) is set aside, ended; the search goes on with the others. The result is the best
    by ``normalised_score`` of the ended ones and of those that reached ``length``. A width of 1 is
    greedy decoding; a width of at least V**length is exhaustive search.
    """
    if not prime_ids:
        raise CharlmError("the prime is empty: give at least one symbol")
    if width < 1:
        raise CharlmError(f"the beam width must be at least 1, not {width}")
    if length == 0:
        return Beam([], [])
    device = next(model.parameters()).device
    logits, state = model(torch.tensor([list(prime_ids)], device=device), model.initial_state(1, device=device))
    last = logits[:, -1]
    step = model.for_sampling().step
    banned = torch.tensor(list(banned_ids), dtype=torch.long, device=device)
    live, totals = [Beam([], [])], torch.zeros(1, device=device)
    ended: list[Beam] = []
    for position in range(length):
        log_probs = torch.log_softmax(last.float(), dim=-1)
        if len(banned):
            log_probs = log_probs.index_fill(1, banned, float("-inf"))
        live, parents, tokens, next_totals, newly_ended = extend(live, totals, log_probs, width, finished)
        ended.extend(newly_ended)
        if not live or position + 1 == length:
            break
        index = torch.tensor(parents, device=device)
        totals = torch.tensor(next_totals, device=device)
        logits, state = step(torch.tensor(tokens, device=device), select_rows(state, index))
        last = logits
    ended.extend(beam for beam in live if len(beam.ids) == length)
    if not ended:
        raise CharlmError("no symbol can follow the prime: every one is the unknown entry")
    return max(ended, key=lambda beam: beam.score(length_penalty))  # the first found of equals


def extend(live: list[Beam], totals: torch.Tensor, log_probs: torch.Tensor, width: int, finished):
    """The ``width`` most probable unended extensions of the ``live`` beams (with their parents' rows,
    their last tokens and their totals), and the ended ones that rank above the last of them."""
    vocabulary = log_probs.shape[1]
    candidates = (totals[:, None] + log_probs).flatten()
    keep = min(width if finished is None else 2 * width, candidates.numel())
    while True:  # with stop strings, look further down the ranking while ended extensions crowd out live ones
        values, chosen = torch.topk(candidates, keep)  # best first
        kept, parents, tokens, next_totals, ended = [], [], [], [], []
        ran_out = keep == candidates.numel()  # every candidate looked at, or the rest impossible (banned)
        for flat, total, token_log_prob in zip(chosen.tolist(), values.tolist(), log_probs.flatten()[chosen].tolist()):
            if math.isnan(total):
                raise CharlmError(
                    "the model's next-symbol probabilities are not numbers (NaN): its weights or its state overflowed"
                )
            if total == float("-inf"):
                ran_out = True
                break
            if len(kept) == width:
                break
            parent, token = divmod(flat, vocabulary)
            beam = Beam(live[parent].ids + [token], live[parent].log_probs + [token_log_prob])
            if finished is not None and finished(beam.ids):
                ended.append(beam)
                continue
            kept.append(beam)
            parents.append(parent)
            tokens.append(token)
            next_totals.append(total)
        if len(kept) == width or ran_out:
            return kept, parents, tokens, next_totals, ended
        keep = min(2 * keep, candidates.numel())
