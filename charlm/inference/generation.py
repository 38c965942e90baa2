"""One generated continuation: its text piece by piece, cut after a stop string, and its log probability."""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import torch

from charlm.config_inference import SampleConfig
from charlm.errors import ConfigError
from charlm.inference.beam import beam_search
from charlm.inference.sampling import unknown_ids
from charlm.runtime.memory import check_beam_fits

LN2 = math.log(2.0)


def check_stops(stop) -> list[str]:
    """The stop strings as a list (one string stands for itself); an empty one is an error."""
    if stop is not None and not isinstance(stop, (str, list, tuple)):
        raise ConfigError(SampleConfig, "stop", f"must be a string or a list of strings, not {stop!r}")
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    for text in stops:
        if not isinstance(text, str) or not text:
            raise ConfigError(SampleConfig, "stop", f"must be a non-empty string, not {text!r}")
    return stops


def stop_end(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where ``text`` ends if it is cut after the first stop string it holds that ends after
    ``start`` (the end of that occurrence), or None if it holds none."""
    ends = []
    for stop in stops:
        found = text.find(stop, max(0, start - len(stop) + 1))
        if found >= 0:
            ends.append(found + len(stop))
    return min(ends) if ends else None


def until_stop(pieces: Iterator[str], stops: Sequence[str]) -> Iterator[str]:
    """The pieces as they come, up to and including the first stop string the text they make holds
    (a string may span pieces); then no more is asked of ``pieces``."""
    text = ""
    for piece in pieces:
        written, text = len(text), text + piece
        end = stop_end(text, stops, written) if stops else None
        if end is not None:
            if end > written:
                yield text[written:end]
            return
        yield piece


@torch.inference_mode()
def continuation_log_probs(model, prime_ids: Sequence[int], ids: Sequence[int]) -> list[float]:
    """Natural-log probability of each of ``ids`` given the prime and the ids before it, under the
    model itself (temperature 1, nothing filtered): one pass over prime and continuation."""
    if not ids:
        return []
    device = next(model.parameters()).device
    tokens = torch.tensor([list(prime_ids) + list(ids)], device=device)
    logits, _ = model(tokens[:, :-1], model.initial_state(1, device=device))
    predicted = torch.log_softmax(logits[0, len(prime_ids) - 1 :].float(), dim=-1)
    return predicted.gather(1, tokens[0, len(prime_ids) :, None]).squeeze(1).tolist()


class Generation:
    """The text generated after a prime, piece by piece: an iterator of strings. Once it has been
    read to the end, ``ids`` holds the symbols (tokens) generated and ``log_prob`` their total
    natural-log probability under the model given the prime (temperature 1, nothing filtered;
    with a stop string, up to the symbol that completed it)."""

    def __init__(
        self,
        pieces: Iterator[str],
        ids: list[int],
        model=None,
        prime_ids: Sequence[int] = (),
        log_probs: list[float] | None = None,
    ):
        self._pieces = pieces
        self.ids = ids  # filled as the pieces are read
        self._model, self._prime_ids, self._log_probs = model, list(prime_ids), log_probs

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        if hasattr(self._pieces, "close"):
            self._pieces.close()

    @property
    def log_probs(self) -> list[float]:
        """Each generated symbol's natural-log probability given everything before it."""
        if self._log_probs is None or len(self._log_probs) != len(self.ids):
            self._log_probs = continuation_log_probs(self._model, self._prime_ids, self.ids)
        return self._log_probs

    @property
    def log_prob(self) -> float:
        """ln P(continuation | prime)."""
        return math.fsum(self.log_probs)

    @property
    def log2_prob(self) -> float:
        """log₂ P(continuation | prime): minus the bits the continuation costs."""
        return self.log_prob / LN2

    @property
    def bits_per_symbol(self) -> float:
        return -self.log2_prob / len(self.ids) if self.ids else 0.0


def beam_generation(
    model, tokenizer, prime_ids: Sequence[int], config: SampleConfig, stops: Sequence[str]
) -> Generation:
    """The continuation a beam search of width ``config.beam`` finds, as one piece (cut after the
    first stop string), searched when that piece is first asked for; whether it fits is checked now."""
    check_beam_fits(model, config.beam, config.length)
    found: list[int] = []
    log_probs: list[float] = []

    def pieces() -> Iterator[str]:
        ended = (lambda ids: stop_end(tokenizer.decode(ids), stops) is not None) if stops else None
        best = beam_search(
            model, prime_ids, config.length, config.beam, config.length_penalty, unknown_ids(tokenizer), ended
        )
        found.extend(best.ids)
        log_probs.extend(best.log_probs)
        text = tokenizer.decode(best.ids)
        yield text[: stop_end(text, stops) or len(text)] if stops else text

    return Generation(pieces(), found, model, prime_ids, log_probs)


def recorded(ids: Iterator[int], into: list[int]) -> Iterator[int]:
    """``ids`` as they come, each appended to ``into`` first."""
    for token in ids:
        into.append(token)
        yield token
