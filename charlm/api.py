"""charlm from Python: ``charlm.train`` trains a run; ``charlm.load`` gives a ``Model`` that samples,
scores and evaluates.

    import charlm
    summary = charlm.train(charlm.TrainConfig(corpus="wp", cell="lru", params="1M", epochs=1))
    model = charlm.load("runs/wp-lru")                 # a run directory, a checkpoint or an export
    model.sample("Prince Andrew", length=200, temperature=0.8, seed=1)
    model.score("Some text.").bpc
    model.evaluate("test").bpc

Every command of the CLI that reads a checkpoint goes through this class.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from charlm.api_scoring import TextScore, dynamic_options, evaluate_split, first_position, score_text
from charlm.checkpoint import Checkpoint
from charlm.config import TrainConfig
from charlm.config_inference import DEFAULT_PRIME, DynamicOptions, EvalConfig, SampleConfig, ScoreConfig
from charlm.settings import validate
from charlm.runtime.devices import resolve_device
from charlm.runs.best_weights import best_of_run
from charlm.errors import CharlmError, NoCheckpoint, OutOfVocabulary, out_of_memory
from charlm.logs import get_logger
from charlm.model import count_parameters
from charlm.inference.beam import check_beam_settings
from charlm.inference.generation import Generation, beam_generation, check_stops, recorded, until_stop
from charlm.inference.sampling import decoded_pieces, encode_prime, generate, outside_vocabulary, unknown_ids
from charlm.training.run_inputs import new_run_inputs
from charlm.training.trainer import Trainer
from charlm.runs.first_save import explained
from charlm.files import access_error

__all__ = ["Model", "TextScore", "dynamic_options", "first_position", "load", "train"]

_SAMPLE = SampleConfig()
_SCORE = ScoreConfig()
_EVAL = EvalConfig()


def _one_error(memory_advice: str):
    """The boundary of ``charlm.train`` and ``charlm.load``: an ``OSError`` (a path that cannot be used)
    becomes one ``CharlmError`` naming the file, memory running out an ``OutOfMemory``
    (``charlm.errors.out_of_memory``) with ``memory_advice``, and a run directory without a checkpoint
    says why (``charlm.runs.first_save``), as the command line prints them."""

    def boundary(function):
        @functools.wraps(function)
        def bounded(*args, **kwargs):
            try:
                return function(*args, **kwargs)
            except NoCheckpoint as error:
                raise explained(error) from None
            except CharlmError:
                raise
            except OSError as error:
                raise access_error(error) from error
            except (RuntimeError, MemoryError) as error:
                problem = out_of_memory(error, memory_advice)
                if problem is None:
                    raise
                raise problem from error

        return bounded

    return boundary


@_one_error("use a smaller batch_size (or hidden_size, bptt)")
def train(config: TrainConfig | None = None, **settings) -> dict:
    """Train a new run under ``config`` and return its summary (``charlm.Trainer(config).fit()``;
    ``Trainer.resume(run_dir).fit()`` continues a run). Settings may also be given as keywords,
    alone or over ``config``: ``charlm.train(corpus="pydoc", cell="lru", hidden_size=128, epochs=1)``;
    each is checked as a ``--config`` file's values are (``layers=1.5`` is refused).

    ``text="input.txt"`` (or a list of files, or ``corpus="input.txt"``) prepares the text first, as
    ``charlm train --text`` does; an ``eval_batch_size`` left at its default is lowered to what a
    short split allows."""
    if config is not None and not isinstance(config, TrainConfig):
        raise CharlmError(
            f"config must be a charlm.TrainConfig (or give the settings as keywords), not {type(config).__name__}"
        )
    if isinstance(settings.get("text"), (str, os.PathLike)):  # one file
        settings["text"] = [settings["text"]]
    if isinstance(settings.get("text"), (list, tuple)):  # paths as text, as a --config file holds them
        settings["text"] = [os.fspath(path) if isinstance(path, os.PathLike) else path for path in settings["text"]]
    defaults = TrainConfig().to_dict()
    named = set(settings) | {
        name for name, value in (config.to_dict() if config else {}).items() if value != defaults[name]
    }
    # Through from_dict whichever way the settings came, so that both get the same checks (and a Path
    # for run_dir becomes text, as a keyword's does).
    config = TrainConfig.from_dict({**(config or TrainConfig()).to_dict(), **settings})
    config.validate()  # every setting, before anything is made (the Trainer checks again)
    return Trainer(new_run_inputs(config, named)).fit()


@_one_error("the model does not fit: load it on another device (device=...)")
def load(
    reference: str | Path,
    device: str = "auto",
    *,
    cells=(),
    trust_code: bool = False,
    prefer: str = "best",
    cuda_graphs: bool = True,
) -> "Model":
    """The model in a run directory (its ``best.pt``; ``prefer="last"`` for ``last.pt``), a
    checkpoint file or an exported model. A user cell (``module:Class``) is imported only if it
    is named in ``cells`` (the class, or its ``"module:Class"`` name) or ``trust_code=True``.
    ``cuda_graphs=False``: on a GPU, score and sample without CUDA graphs (``--no-cuda-graph``)."""
    target = resolve_device(device)
    checkpoint = Checkpoint.load(reference, prefer=prefer, map_location="cpu")
    if prefer == "best" and Path(reference).is_dir():  # the run's best weights, or a warning saying which are used
        checkpoint = best_of_run(Path(reference), checkpoint, lambda file: Checkpoint.load(file, map_location="cpu"))
    return Model(checkpoint, target, cells=cells, trust_code=trust_code, cuda_graphs=cuda_graphs)


class Model:
    """A trained language model with its vocabulary, on a device, in eval mode."""

    def __init__(
        self, checkpoint: Checkpoint, device="cpu", *, cells=(), trust_code: bool = False, cuda_graphs: bool = True
    ):
        for name, value in (("trust_code", trust_code), ("cuda_graphs", cuda_graphs)):
            if not isinstance(value, bool):  # trust_code="no" is truthy: never trust a file on a guess
                raise CharlmError(f"{name} must be True or False, not {value!r}")
        self.checkpoint = checkpoint
        self.cuda_graphs = cuda_graphs  # on a GPU: scoring and sampling replayed from checked CUDA graphs
        self.last_fast_path = None  # the first-use check of the last scoring graph (FastPathCheck), if one was tried
        self.device = resolve_device(device) if isinstance(device, str) else device
        self.network = checkpoint.build_model(self.device, cells=cells, trust_code=trust_code)
        self.tokenizer = checkpoint.make_tokenizer()
        self._corpora = {}  # by data_dir: the corpus (or the version of it) the model was trained on

    def __repr__(self):
        config = self.config
        return (
            f"Model({config.cell}, {config.layers}×{config.hidden_size}, {self.parameters_count:,} parameters, "
            f"vocabulary {len(self.vocabulary)}, {self.device})"
        )

    @property
    def config(self):
        """The ModelConfig (cell, sizes, options)."""
        return self.checkpoint.model_config

    @property
    def vocabulary(self) -> list[str]:
        return list(self.tokenizer.vocab)

    @property
    def parameters_count(self) -> int:
        return count_parameters(self.network)

    @property
    def unit(self) -> str:
        """ "char", "byte" or "subword", from the tokenizer."""
        return {"char": "char", "byte": "byte", "word": "word"}.get(self.checkpoint.tokenizer.get("kind"), "subword")

    # --- sampling ------------------------------------------------------------------------------
    def stream(
        self,
        prime: str | None = None,
        length: int = _SAMPLE.length,
        temperature: float = _SAMPLE.temperature,
        top_k: int = _SAMPLE.top_k,
        top_p: float = _SAMPLE.top_p,
        seed: int | None = _SAMPLE.seed,
        *,
        stop: str | list[str] = (),
        beam: int = _SAMPLE.beam,
        length_penalty: float = _SAMPLE.length_penalty,
    ) -> Generation:
        """The continuation only, without the prime (``sample`` returns the prime and the
        continuation), piece by piece as it is drawn: a ``Generation``,
        which once read to the end also gives the continuation's ``log_prob`` (natural log, under
        the model itself given the prime), ``log2_prob`` and ``bits_per_symbol``. The settings and
        the prime are checked here, before the first piece is asked for.

        ``stop``: a string or a list of them; the text ends with the first one generated (included).
        ``beam``: 0 draws at random; N ≥ 1 gives the most probable continuation a beam search of
        width N finds (1 is greedy decoding), scored by log probability / length ** ``length_penalty``
        (alpha matters only when a stop string ends continuations at different lengths). Beam
        search is deterministic and takes no temperature, top_k, top_p or seed; its text comes
        as one piece once the search is done."""
        stops = check_stops(stop)
        config = SampleConfig(
            length=length,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            beam=beam,
            length_penalty=length_penalty,
        )
        validate(config)
        check_beam_settings(config)
        stops = [self.normalise(text) for text in stops]
        prime_ids, _ = self._prime(prime)
        if not prime_ids:
            raise CharlmError("the prime is empty: give at least one symbol")
        if beam:
            return beam_generation(self.network, self.tokenizer, prime_ids, config, stops)
        if top_k > len(self.tokenizer.vocab):
            get_logger().warning(
                f"warning: top-k {top_k} is more than the {len(self.tokenizer.vocab)} symbols of the "
                "vocabulary: sampling from all of them"
            )
        drawn: list[int] = []
        ids = generate(self.network, prime_ids, config, unknown_ids(self.tokenizer), cuda_graph=self.cuda_graphs)
        pieces = until_stop(decoded_pieces(self.tokenizer, recorded(ids, drawn)), stops)
        return Generation(pieces, drawn, self.network, prime_ids)

    def sample(
        self,
        prime: str | None = None,
        length: int = _SAMPLE.length,
        temperature: float = _SAMPLE.temperature,
        top_k: int = _SAMPLE.top_k,
        top_p: float = _SAMPLE.top_p,
        seed: int | None = _SAMPLE.seed,
        *,
        stop: str | list[str] = (),
        beam: int = _SAMPLE.beam,
        length_penalty: float = _SAMPLE.length_penalty,
    ) -> str:
        """The prime followed by ``length`` generated symbols, as one string: unlike ``stream``, which
        gives the continuation alone, the text starts with the prime (as normalised; the default
        prime, a line break, where none is given). Fewer symbols where a ``stop`` string ended it; ``beam``: the most
        probable continuation, see ``stream``."""
        pieces = self.stream(
            prime, length, temperature, top_k, top_p, seed, stop=stop, beam=beam, length_penalty=length_penalty
        )
        return self._prime(prime)[1] + "".join(pieces)

    def _prime(self, prime: str | None) -> tuple[list[int], str]:
        """Token ids and text of the prime; None means a line break (or the first symbol)."""
        if prime is None:
            if getattr(self.tokenizer, "eos_id", None) is not None:  # words: the start of a sentence
                ids = [self.tokenizer.eos_id]
            else:
                ids = self.tokenizer.encode(DEFAULT_PRIME) if DEFAULT_PRIME in self.tokenizer.vocab else [0]
            return ids, self.tokenizer.decode(ids)
        prime = self.normalise(prime)
        return encode_prime(self.tokenizer, prime), prime

    # --- scoring any text ----------------------------------------------------------------------
    def encode(self, text: str, unknown: str = _SCORE.unknown) -> tuple[list[int], int]:
        """Token ids of ``text`` and the number of characters skipped. ``unknown``: "error" names the
        characters outside the vocabulary, "skip" drops them, "unk" maps them to the unknown entry."""
        if unknown not in ("error", "skip", "unk"):
            raise CharlmError(f"unknown must be error, skip or unk, not {unknown!r}")
        text = self.normalise(text)
        outside = outside_vocabulary(self.tokenizer, text)
        if not outside:
            return self.tokenizer.encode(text), 0
        if unknown == "error":
            raise OutOfVocabulary(outside, where=first_position(text, outside))
        if unknown == "unk":
            if self.tokenizer.unk is None:
                raise CharlmError(
                    'this model\'s vocabulary has no unknown entry: use --unknown skip (unknown="skip" from Python)'
                )
            try:
                return self.tokenizer.encode(text), 0
            except OutOfVocabulary:
                unk_id = self.tokenizer.vocab.index(self.tokenizer.unk)
                return [unk_id if c in outside else self.tokenizer.encode(c)[0] for c in text], 0
        if hasattr(self.tokenizer, "unknown_words"):  # a vocabulary of words or word pieces: skip whole words
            kept = "\n".join(
                " ".join(word for word in line.split() if word not in set(outside)) for line in text.split("\n")
            )
        else:
            kept = "".join(c for c in text if c not in set(outside))
        return self.tokenizer.encode(kept), len(text) - len(kept)

    def normalise(self, text: str) -> str:
        """``text`` as the model's corpus was prepared: a byte-order mark stripped and CRLF or CR line
        ends turned into LF, unless the vocabulary holds those characters (a byte model reads bytes
        as they are)."""
        if not isinstance(text, str):
            hint = ": decode it first, e.g. text.decode('utf-8')" if isinstance(text, (bytes, bytearray)) else ""
            raise CharlmError(f"text must be a str, not {type(text).__name__}{hint}")
        if self.unit == "byte":
            return text
        vocabulary = set(self.tokenizer.vocab)
        if "\ufeff" not in vocabulary:
            text = text.removeprefix("\ufeff")
        if "\r" not in vocabulary:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        return text

    def score(
        self,
        text: str,
        *,
        per_char: bool = False,
        unknown: str = _SCORE.unknown,
        dynamic: DynamicOptions | str | None = None,
        batch_size: int = _SCORE.batch_size,
        data_dir=None,
        progress=None,
    ) -> TextScore:
        """Bits per character of ``text``, state carried through it; ``per_char`` adds each
        predicted symbol's log-probability. ``dynamic`` ("sgd", "rms" or DynamicOptions) adapts
        the weights test-then-train while scoring (rms reads its gradient statistics from the
        training split of the model's corpus); the model's weights are restored afterwards.
        ``progress``: an object with ``stage(label, total)``, as ``evaluate``'s with ``dynamic``."""
        return score_text(
            self,
            text,
            per_char=per_char,
            unknown=unknown,
            dynamic=dynamic,
            batch_size=batch_size,
            data_dir=data_dir,
            progress=progress,
        )

    # --- evaluating on the corpus ----------------------------------------------------------------
    def corpus(self, data_dir=None):
        """The prepared corpus the model was trained on (its vocabulary checked), in the version it was
        trained on (a ``CorpusChanged`` error when that version is no longer there)."""
        if str(data_dir) not in self._corpora:
            self._corpora[str(data_dir)] = self.checkpoint.corpus(data_dir)
        return self._corpora[str(data_dir)]

    def evaluate(
        self,
        split: str = _EVAL.split,
        *,
        dynamic: DynamicOptions | str | None = None,
        data_dir=None,
        batch_size: int | None = None,
        bptt: int | None = None,
        adapt_on: str | None = None,
        search_prefix: int | None = None,
        progress=None,
        record: bool = True,
    ):
        """Static bits per character of a whole split (a ``Score``); with ``dynamic``, the static and
        dynamic figures (a ``DynamicReport``; the weights stay adapted until ``restore()``).
        ``progress``: for static, ``callback(tokens)``; for dynamic, an object with ``stage``.
        ``record``: append an ``eval`` record to the run's metrics.jsonl, if the checkpoint is in one."""
        return evaluate_split(
            self,
            split,
            dynamic=dynamic,
            data_dir=data_dir,
            batch_size=batch_size,
            bptt=bptt,
            adapt_on=adapt_on,
            search_prefix=search_prefix,
            progress=progress,
            record=record,
        )

    def restore(self) -> None:
        """Put back the checkpoint's weights (after a dynamic evaluation adapted them)."""
        self.network.load_state_dict(self.checkpoint.weights)

    # --- writing -------------------------------------------------------------------------------
    def current_checkpoint(self, **changes) -> Checkpoint:
        """The checkpoint with the network's current weights (adapted ones, after ``evaluate``)."""
        weights = {name: tensor.detach().cpu().clone() for name, tensor in self.network.state_dict().items()}
        return dataclasses.replace(self.checkpoint, weights=weights, path=None, **changes)

    def export(self, path: str | Path) -> Path:
        """A slim inference file: weights, configs, vocabulary and provenance; no training state."""
        return self.checkpoint.exported().save(path)
