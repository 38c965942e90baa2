"""What the page shows of a text under a model: each symbol's probability with the model's top
alternatives, and the hidden state (and cell memory) of a layer after each symbol."""

from __future__ import annotations

import math

import torch

from charlm.api import Model
from charlm.errors import CharlmError

LN2 = math.log(2.0)
WINDOW = 1024  # symbols per forward pass when finding alternatives (the state carried between windows)


def score_text(model: Model, text: str, unknown: str, top: int) -> dict:
    """``Model.score`` of ``text`` (the numbers ``charlm score`` prints and writes with --per-char),
    and for each predicted symbol the ``top`` most probable symbols the model expected there."""
    scored = model.score(text, per_char=True, unknown=unknown)
    ids, _ = model.encode(text, unknown)
    alternatives = top_alternatives(model, ids, top) if top else [[] for _ in ids[1:]]
    symbols = model.tokenizer.vocab
    per_char = [
        {
            "symbol": symbol,
            "logprob": round(float(log_prob), 6),
            "surprisal": round(-float(log_prob) / LN2, 6),
            "top": [{"symbol": symbols[index], "p": round(p, 6)} for index, p in choices],
        }
        for symbol, log_prob, choices in zip(scored.symbols, scored.log_probs, alternatives)
    ]
    return {
        "bits": scored.nats / LN2,
        "bpc": scored.bpc,
        "nats": scored.nats,
        "tokens": scored.tokens,
        "characters": scored.characters,
        "skipped": scored.skipped,
        "first": model.tokenizer.decode(ids[:1]),
        "per_char": per_char,
    }


@torch.inference_mode()
def top_alternatives(model: Model, ids: list[int], top: int) -> list[list[tuple[int, float]]]:
    """For each of ``ids[1:]``: the ``top`` (symbol id, probability) pairs of the model's prediction
    there, most probable first; the text read in windows, the state carried across them."""
    network, device = model.network, model.device
    tokens = torch.tensor([ids[:-1]], device=device)
    state = network.initial_state(1, device=device)
    found = []
    for start in range(0, tokens.shape[1], WINDOW):
        logits, state = network(tokens[:, start : start + WINDOW], state)
        values, indexes = torch.softmax(logits[0].float(), dim=-1).topk(min(top, logits.shape[-1]), dim=-1)
        found.extend(zip(indexes.tolist(), values.tolist()))
    return [list(zip(indexes, values)) for indexes, values in found]


class _Recording:
    """One layer's inference step, recording what it passes up and the state it keeps."""

    def __init__(self, step, into: list):
        self._step, self._into = step, into

    def __getattr__(self, name):
        return getattr(self._step, name)

    def advance(self, projected, x, state):
        output, state = self._step.advance(projected, x, state)
        self._into.append((output, state))
        return output, state


@torch.inference_mode()
def layer_states(model: Model, ids: list[int], layer: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output of layer ``layer`` after each of ``ids`` (``[T, width]``) and its cell memory (the
    second tensor of the layer's state, where it has one; else None): the sampling step, symbol by symbol."""
    network, device = model.network, model.device
    inference = network.for_sampling()
    records: list = []
    inference.layers = list(inference.layers)
    inference.layers[layer] = _Recording(inference.layers[layer], records)
    state = network.initial_state(1, device=device)
    for token in ids:
        _, state = inference.step(torch.tensor([token], device=device), state)
    hidden = torch.cat([output for output, _ in records]).float()
    memory = torch.cat([kept[1] for _, kept in records]).float() if len(records[0][1]) > 1 else None
    return hidden, memory


def activations(model: Model, text: str, layer: int, units: list[int] | None, top: int, unknown: str) -> dict:
    """Per symbol of ``text``: the chosen ``units`` of layer ``layer`` (or the ``top`` that vary most
    over the text), and the cell memory of the same units where the cell keeps one."""
    layers = model.config.layers
    if not 0 <= layer < layers:
        raise CharlmError(f"layer must be in [0, {layers - 1}] (the model has {layers}), not {layer}")
    ids, skipped = model.encode(text, unknown)
    if not ids:
        raise CharlmError("the text is empty: give at least one symbol")
    hidden, memory = layer_states(model, ids, layer)
    width = hidden.shape[1]
    if units is None:
        spread = hidden.std(dim=0) if len(ids) > 1 else hidden.abs()[0]
        units = spread.argsort(descending=True)[:top].tolist()
    outside = [unit for unit in units if not 0 <= unit < width]
    if outside:
        raise CharlmError(f"units must be in [0, {width - 1}] (layer {layer} has {width}), not {outside[0]}")
    rows = lambda values: [[round(v, 4) for v in values[:, unit].tolist()] for unit in units]  # noqa: E731
    kept = memory is not None and memory.shape[1] == width
    return {
        "layer": layer,
        "layers": layers,
        "width": width,
        "skipped": skipped,
        "symbols": [model.tokenizer.decode([token]) for token in ids],
        "units": units,
        "hidden": rows(hidden),
        "memory": rows(memory) if kept else None,
    }
