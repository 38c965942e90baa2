"""Sampling text from a trained model: temperature, top-k and nucleus (top-p) filtering, streamed."""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor

from charlm.runtime.seeds import torch_seed
from charlm.config_inference import SampleConfig
from charlm.corpora import Tokenizer
from charlm.errors import CharlmError, OutOfVocabulary
from charlm.runtime.cuda_graphs import graphed_step
from charlm.model import LanguageModel


# Float32 logits divided by a temperature above 1e30 differ from 0 by less than float32 can show beside
# them: the draw is uniform over the symbols allowed, as the user meant, where 1e300 (infinite in float32)
# would give NaN. Below 1e-30 the likeliest symbol wins (greedy), where 1e-300 would overflow the logits;
# 0 takes it without drawing, as beam search of width 1 does.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-30, 1e30


def outside_vocabulary(tokenizer: Tokenizer, text: str) -> list[str]:
    """Characters of ``text`` the vocabulary lacks, or has only as its unknown-symbol entry."""
    try:
        tokenizer.encode(text)
    except OutOfVocabulary as error:
        return error.symbols
    if tokenizer.unk is None:
        return []
    if hasattr(tokenizer, "unknown_words"):  # a word vocabulary: whole words, not characters
        return tokenizer.unknown_words(text)
    unk_id = tokenizer.vocab.index(tokenizer.unk)
    return sorted(c for c in set(text) if unk_id in tokenizer.encode(c))


def encode_prime(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of the prime; characters the model has never seen are an error, even where the
    vocabulary has an unknown-symbol entry (a prime of unknowns would be a silent garbage start)."""
    undecodable = [ord(c) - 0xDC00 for c in text if 0xDC80 <= ord(c) <= 0xDCFF]  # bytes the shell passed as they were
    if undecodable:
        raise CharlmError(f"the prime is not UTF-8 text (byte 0x{undecodable[0]:02x})")
    unknown = outside_vocabulary(tokenizer, text)
    if not unknown:
        return tokenizer.encode(text)
    shown = ", ".join(repr(symbol) for symbol in unknown)
    raise CharlmError(f"the prime has characters outside the model's vocabulary: {shown}")


def unknown_ids(tokenizer: Tokenizer) -> list[int]:
    return [tokenizer.vocab.index(tokenizer.unk)] if tokenizer.unk is not None else []


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Set to −inf every logit outside the top k and outside the smallest set with mass ≥ top_p."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probabilities = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probabilities, dim=-1) - probabilities
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False  # the most likely token always stays (a top_p below float32's least is 0 there)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def draw(probabilities: Tensor, generator: torch.Generator) -> Tensor:
    """One index drawn from ``probabilities`` ``[V]``, as a tensor ``[1]``.

    The algorithm of ``torch.multinomial(probabilities, 1, generator=generator)`` (the index of
    the largest p / q, q ~ Exp(1)), so a generator state draws the same index, without
    multinomial's checks of the distribution, each of which reads a result back.
    """
    race = torch.empty_like(probabilities).exponential_(generator=generator)
    return torch.argmax(probabilities / race, dim=-1, keepdim=True)


def sampling_step(model: LanguageModel, state: list, cuda_graph: bool = True):
    """What ``generate`` calls for each symbol after the first: the model's sampling step (on a GPU,
    a checked CUDA graph of it), made once per model and kept until its weights change, so that a
    run of samples captures once, not once a sample."""
    version = (state[0][0].device, cuda_graph, model.training, tuple(p._version for p in model.parameters()))
    kept = model.__dict__.get("_sampling_step")
    if kept is not None and kept[0] == version:
        return kept[1]
    step = graphed_step(model.for_sampling(), state, enabled=cuda_graph)
    model.__dict__["_sampling_step"] = (version, step)  # a plain attribute: not a weight, not in state_dict
    return step


@torch.inference_mode()
def generate(
    model: LanguageModel, prime_ids: list[int], config: SampleConfig, banned_ids=(), cuda_graph: bool = True
) -> Iterator[int]:
    """Yield ``config.length`` token ids, each drawn given the prime and everything drawn before.

    ``banned_ids`` are never drawn (the unknown-symbol entry: it stands for no character).
    ``cuda_graph=False``: on a GPU, step without a CUDA graph (``--no-cuda-graph``).
    """
    if not prime_ids:
        raise CharlmError("the prime is empty: give at least one symbol")
    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    if config.seed is not None:
        generator.manual_seed(torch_seed(config.seed))
    else:
        generator.seed()
    state = model.initial_state(1, device=device)
    logits, state = model(torch.tensor([prime_ids], device=device), state)
    step = None  # the model's step, or on a GPU that step replayed from a CUDA graph: fetched when first needed
    banned = torch.tensor(list(banned_ids), dtype=torch.long, device=device)
    last = logits[0, -1]
    greedy = config.temperature == 0  # the likeliest symbol at each step (as --beam 1), whatever top-k and top-p keep
    temperature = min(max(config.temperature, MIN_TEMPERATURE), MAX_TEMPERATURE)
    for drawn in range(config.length):
        last = last.float()
        if len(banned):
            last = last.index_fill(0, banned, float("-inf"))
        if greedy:
            scores = last
        else:
            if config.temperature != 1.0:  # dividing by 1 changes nothing
                last = last / temperature
            scores = torch.softmax(filter_logits(last, config.top_k, config.top_p), dim=-1)
        if torch.isnan(scores).any():
            raise CharlmError(
                "the model's next-symbol probabilities are not numbers (NaN): its weights or its state overflowed"
            )
        token = torch.argmax(scores, dim=-1, keepdim=True) if greedy else draw(scores, generator)
        yield int(token)
        if drawn + 1 == config.length:
            break  # nothing is drawn after the last symbol: no step for it
        if step is None:
            step = sampling_step(model, state, cuda_graph)
        logits, state = step(token, state)
        last = logits[0]


def decoded_pieces(tokenizer: Tokenizer, ids: Iterator[int]) -> Iterator[str]:
    """Decode token ids as they arrive and yield only the new text (subword pieces may merge)."""
    drawn: list[int] = []
    written = ""
    for token in ids:
        drawn.append(token)
        text = tokenizer.decode(drawn)
        if text.startswith(written) and len(text) > len(written):
            yield text[len(written) :]
            written = text
    final = tokenizer.decode(drawn)
    if final != written and final.startswith(written):
        yield final[len(written) :]
