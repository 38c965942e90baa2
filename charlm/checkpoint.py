"""The checkpoint: a typed record of a model, its configs, vocabulary, training state and origin.

On disk it is a dict of tensors and plain containers (``torch.load(..., weights_only=True)`` reads
it), written atomically, tagged with a format version. Format 1 (charlm 0.1's bare dict) is still
read. Three kinds share the format: ``training`` (``last.pt``, ``best.pt``), ``export`` (weights,
configs and vocabulary only) and ``adapted`` (weights after dynamic evaluation). Of the training
checkpoints only ``last.pt`` (and ``previous.pt``) keep the optimizer's state, which resuming needs;
``best.pt`` and the epoch checkpoints are written ``without_optimizer``. An export may also be a
safetensors file (``charlm.checkpoint_safetensors``), read into the same payload and checked alike.

Loading never runs code named in the file: a checkpoint of a user cell (``module:Class``) builds
its model only when the caller names that cell or trusts the file (see ``build_model``). What is
read is untrusted input: ``charlm.checkpoint_checks`` checks its types, bounds and consistency at
every load, and its shapes against the model it describes (on the meta device) and the memory that
model needs before one is built. A run directory's ``best.pt`` is checked against the run's own
account of its best epoch (``charlm.runs.best_weights``).
"""

from __future__ import annotations

import dataclasses
import errno
import io
import os
import pickle
import re
import warnings
from pathlib import Path

import torch

from charlm import __version__
from charlm.cells import CELLS
from charlm.checkpoint_checks import check_against_model, check_consistency, check_parts
from charlm.config import TrainConfig
from charlm.errors import CharlmError, NoCheckpoint
from charlm.files import atomic_write_bytes, path_value
from charlm import checkpoint_safetensors
from charlm.logs import info
from charlm.model import LanguageModel, ModelConfig
from charlm.corpora.tokenizer_kinds import tokenizer_from_state
from charlm.corpora import load_corpus
from charlm.corpora.catalog import TrainedOn

FORMAT = "charlm-checkpoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
KINDS = ("training", "export", "adapted")  # and "task": `charlm task`, whose payload is its own (task_payload)
CORPUS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclasses.dataclass
class TrainingState:
    """What resuming needs beyond the weights."""

    optimizer: dict | None  # None in best.pt and epoch checkpoints (``without_optimizer``): resuming restarts it
    scheduler: dict | None  # ExponentialLR's state; None in format 1
    rng: dict  # {"torch": ByteTensor, "ranks": [{"torch", "device"} per process]} (before 0.3: "cuda": [per device])
    progress: dict  # charlm.training.resume.Progress as a dict
    hidden: list | None  # carried state per layer, [B, n] tensors on the CPU


@dataclasses.dataclass
class Checkpoint:
    model_config: ModelConfig
    train_config: TrainConfig
    tokenizer: dict  # Tokenizer.to_state()
    weights: dict  # the model's state_dict
    kind: str = "training"
    training: TrainingState | None = None
    scores: dict = dataclasses.field(default_factory=dict)  # valid_bpc, test_bpc, epoch of this weights
    provenance: dict = dataclasses.field(default_factory=dict)
    dynamic: dict | None = None  # the adaptation, for kind "adapted"
    charlm_version: str = __version__
    path: Path | None = dataclasses.field(default=None, compare=False)  # where it was read from

    # --- reading and writing -----------------------------------------------------------------

    def to_payload(self) -> dict:
        training = None if self.training is None else dataclasses.asdict(self.training)
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "charlm_version": self.charlm_version,
            "kind": self.kind,
            "model_config": self.model_config.to_dict(),
            "train_config": self.train_config.to_dict(),
            "tokenizer": self.tokenizer,
            "weights": self.weights,
            "training": training,
            "scores": dict(self.scores),
            "provenance": dict(self.provenance),
            "dynamic": self.dynamic,
        }

    def save(self, path: str | Path) -> Path:
        """Write atomically (a temporary file, then a rename)."""
        path = path_value(path, "the checkpoint file to write")
        atomic_write_bytes(path, torch_file(self.to_payload()))
        return path

    @classmethod
    def load(cls, reference: str | Path, *, prefer: str = "best", map_location="cpu") -> "Checkpoint":
        """A checkpoint file, or a run directory (its ``best.pt``, or ``last.pt`` with prefer="last")."""
        path = resolve(reference, prefer)
        payload = read_payload(path, map_location)
        try:
            return cls.from_payload(payload, path)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CharlmError(
                f"{path} is a damaged charlm checkpoint ({type(error).__name__}: {_first_line(error)})"
            ) from None

    @classmethod
    def from_payload(cls, payload, path: Path | None = None) -> "Checkpoint":
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise CharlmError(f"{path} is not a charlm checkpoint")
        version = payload.get("format_version")
        if version not in READABLE_VERSIONS:
            raise CharlmError(
                f"{path} was written by charlm {payload.get('charlm_version')} in checkpoint format "
                f"{version}; this charlm {__version__} reads formats {', '.join(map(str, READABLE_VERSIONS))}"
            )
        if version == 1:
            payload = _from_format_1(payload)
        if payload.get("kind") == "task":
            raise CharlmError(f"{path} is a checkpoint of `charlm task` (go on with `charlm task --resume`)")
        check_parts(payload, path)
        training = payload["training"]
        kind = payload.get("kind", "training")
        if kind not in KINDS:
            raise CharlmError(f"{path} is a charlm checkpoint of unknown kind {kind!r}")
        try:
            model_config = ModelConfig.from_dict(payload["model_config"])
            train_config = TrainConfig.from_dict(payload["train_config"])
        except CharlmError as error:  # a bad or unknown setting: say it is the file's, not a flag
            raise CharlmError(f"{path} holds settings this charlm {__version__} cannot read ({error})") from None
        checkpoint = cls(
            model_config=model_config,
            train_config=train_config,
            tokenizer=payload["tokenizer"],
            weights=payload["weights"],
            kind=kind,
            training=None if training is None else TrainingState(**training),
            scores=dict(payload.get("scores") or {}),
            provenance=dict(payload.get("provenance") or {}),
            dynamic=payload.get("dynamic"),
            charlm_version=payload.get("charlm_version", "?"),
            path=path,
        )
        check_consistency(checkpoint)
        return checkpoint

    # --- what a checkpoint makes --------------------------------------------------------------

    def cell_class(self, cells=(), trust_code: bool = False):
        """The class of the checkpoint's cell. A user cell (``module:Class``) is imported only if the
        caller names it in ``cells`` (a class or its ``module:Class`` name) or ``trust_code`` is set."""
        return CELLS.resolve(
            self.model_config.cell, cells=cells, trust_code=trust_code, source=str(self.path or "the checkpoint")
        )

    def build_model(self, device="cpu", *, cells=(), trust_code: bool = False) -> LanguageModel:
        """The model with these weights, in eval mode, on ``device``; refused where a weight is NaN or
        infinite (it would score ``nan`` and export without a word)."""
        broken = next(
            (
                name
                for name, tensor in self.weights.items()
                if torch.is_tensor(tensor) and tensor.is_floating_point() and not torch.isfinite(tensor).all()
            ),
            None,
        )
        if broken is not None:
            raise CharlmError(
                f"{self.path}: its weights are not all finite numbers ({broken} holds NaN or infinity): "
                "it cannot score, sample or export"
            )
        cell_class = self.cell_class(cells, trust_code)
        check_against_model(self, cell_class)  # on the meta device: every weight's shape, nothing allocated
        device = torch.device(device)
        model = LanguageModel(self.model_config, cell_class=cell_class)
        try:
            model.load_state_dict(self.weights)
        except RuntimeError as error:
            raise CharlmError(
                f"{self.path}: the weights do not fit the model it describes ({_first_line(error)})"
            ) from None
        return model.to(device).eval()

    def make_tokenizer(self):
        try:
            tokenizer = tokenizer_from_state(self.tokenizer)
        except (
            KeyError,
            TypeError,
            ValueError,
            RuntimeError,
            OSError,
        ) as error:  # sentencepiece: RuntimeError, OSError
            raise CharlmError(f"{self.path}: its vocabulary is damaged ({_first_line(error)})") from None
        if list(tokenizer.vocab) != list(self.tokenizer["vocab"]):  # a subword vocabulary is its model's pieces
            raise CharlmError(f"{self.path}: its vocabulary differs from the pieces of its own subword model")
        return tokenizer

    def corpus(self, data_dir=None):
        """The prepared corpus the model was trained on, checked to have the same vocabulary: the version
        it was trained on (``CorpusChanged`` when the corpus was prepared again and that version is gone)."""
        name = self.train_config.corpus
        if not CORPUS_NAME.fullmatch(name):
            raise CharlmError(f"{self.path} names the corpus {name!r}, which is not a corpus name")
        root = data_dir if data_dir is not None else self.train_config.data_dir
        corpus = load_corpus(name, root, trained_on=TrainedOn.of(self.provenance))
        if corpus.is_kept_version:
            info(f"corpus {name!r} was prepared again since {self.path} trained on it: using the version it trained on")
        if list(corpus.tokenizer.vocab) != list(self.tokenizer["vocab"]):
            raise CharlmError(f"the prepared corpus {name!r} has another vocabulary than the checkpoint {self.path}")
        return corpus

    def exported(self) -> "Checkpoint":
        """Weights, configs and vocabulary only: no optimizer, RNG or carried state."""
        weights = {name: tensor.detach().cpu().clone() for name, tensor in self.weights.items()}
        return dataclasses.replace(self, kind="export", training=None, weights=weights, path=None)

    def without_optimizer(self) -> "Checkpoint":
        """The same checkpoint less the optimizer's state (two or three copies of the weights for
        Adam), as ``best.pt`` and the epoch checkpoints are kept: the weights, and the progress, RNG
        streams and schedule (a few KB). Only ``last.pt`` and ``previous.pt`` keep the optimizer."""
        if self.training is None or self.training.optimizer is None:
            return self
        return dataclasses.replace(self, training=dataclasses.replace(self.training, optimizer=None))


def resolve(reference: str | Path, prefer: str = "best") -> Path:
    """A run directory means its ``best.pt`` (or ``last.pt`` if there is no best yet)."""
    if prefer not in ("best", "last"):
        raise CharlmError(f"prefer must be 'best' or 'last', not {prefer!r}")
    path = path_value(reference, "a checkpoint or run directory")
    if path.is_dir():
        for name in (f"{prefer}.pt", "best.pt", "last.pt"):
            if (path / name).is_file():
                return path / name
        raise NoCheckpoint(path)
    if not path.is_file():
        raise CharlmError(f"no such checkpoint or run directory: {path}")
    return path


def _from_format_1(old: dict) -> dict:
    """charlm 0.1's layout: model, optimizer, rng, progress, hidden, config, model_config,
    tokenizer, corpus, and test_bpc/valid_bpc in best.pt or dynamic in an adapted file."""
    training = None
    if old.get("optimizer") is not None and old.get("dynamic") is None:
        training = {
            "optimizer": old["optimizer"],
            "scheduler": None,
            "rng": old["rng"],
            "progress": old["progress"],
            "hidden": old.get("hidden"),
        }
    scores = {key: old[key] for key in ("valid_bpc", "test_bpc") if key in old}
    return {
        "kind": "adapted" if old.get("dynamic") is not None else "training",
        "model_config": old["model_config"],
        "train_config": old["config"],
        "tokenizer": old["tokenizer"],
        "weights": old["model"],
        "training": training,
        "scores": scores,
        "provenance": {},
        "dynamic": old.get("dynamic"),
        "charlm_version": old.get("charlm_version"),
    }


def torch_file(payload) -> memoryview:
    """The bytes ``torch.save`` writes for ``payload``, made in memory: written by Python's own file
    calls, a full disk or a file-size limit fails with the system's reason ("File too large"), which
    torch's writer loses ("[enforce fail at inline_container.cc:672] . unexpected pos ...")."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getbuffer()


def read_payload(path: Path, map_location="cpu"):
    """What ``torch.save`` wrote to ``path``, read weights-only (no code runs); a file torch cannot
    read that way is one line naming it. A safetensors file (``charlm export --format safetensors``)
    gives the same payload (``charlm.checkpoint_safetensors``)."""
    if checkpoint_safetensors.is_safetensors(path):
        return checkpoint_safetensors.read_payload(path)
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing a file
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch.load raises many kinds on a file that is not a checkpoint
        link = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise CharlmError(f"{path}{link} is not a readable charlm checkpoint: {load_failure(error, path)}") from None


def task_payload(config: dict, weights: dict, training: TrainingState) -> dict:
    """A checkpoint of `charlm task`: the same format, kind "task", its TaskConfig in place of a
    language model's settings."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "charlm_version": __version__,
        "kind": "task",
        "task_config": config,
        "weights": weights,
        "training": dataclasses.asdict(training),
    }


def read_task_payload(path: Path) -> dict:
    """A checkpoint ``task_payload`` made (or the "charlm-task-1" file of charlm 0.3), as a
    ``task_payload``."""
    payload = read_payload(path)
    if isinstance(payload, dict) and payload.get("format") == "charlm-task-1":  # charlm 0.3
        progress = payload.get("progress")
        training = TrainingState(payload.get("optimizer"), None, {"torch": payload.get("generator")}, progress, None)
        payload = task_payload(payload.get("config"), payload.get("model"), training)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT or payload.get("kind") != "task":
        raise CharlmError(f"{path} is not a task checkpoint (charlm task writes them)")
    return payload


TORCH_FILE_STARTS = (b"PK\x03\x04", b"\x80")  # torch.save's zip archive; a legacy torch file (a pickle, protocol 2+)


def load_failure(error: Exception, path: Path) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in a few words: first whether it could be
    a torch file at all (the unpickler's own errors on a text file are IndexError, KeyError...)."""
    try:
        with open(path, "rb") as file:
            start = file.read(4)
    except OSError:
        start = None
    truncated = "the file is empty, truncated or not a torch file"  # in place of miniz's words ("not a ZIP archive")
    if start is not None and len(start) < 4 and any(kind.startswith(start) for kind in TORCH_FILE_STARTS):
        return truncated  # the first bytes of a zip archive or a pickle, and no more
    if start and not start.startswith(TORCH_FILE_STARTS):
        return "it is not a torch file at all (torch writes a zip archive or a pickle)"
    text = str(error)
    if isinstance(error, pickle.UnpicklingError) and "WeightsUnpickler error:" in text:
        detail = text.split("WeightsUnpickler error:", 1)[1].strip().split("\n", 1)[0].strip()
        return (
            f"the weights-only loader refused it ({detail}): it is not a checkpoint, or it holds Python "
            "objects, which charlm never unpickles"
        )
    cut_short = isinstance(error, OSError) and error.errno == errno.EINVAL  # torch seeking past a truncated zip's end
    if isinstance(error, EOFError) or cut_short or "PytorchStreamReader failed reading zip archive" in text:
        return truncated
    if "unexpected EOF" in text:  # torch's reader of its older, non-zip format
        return truncated
    return _first_line(error)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:160]
