"""Where a training stands, saved into every checkpoint and restored from one.

``Progress`` is the position in the protocol (epoch, window, step, best scores, wall time);
``training_checkpoint`` writes it with the weights, optimizer, schedule, RNG streams and the carried
state; ``restore`` puts all of it back, so that on the CPU a resumed run ends with exactly the
weights of an uninterrupted one. ``last_good_checkpoint`` finds what a run can resume from, and
``resumed_config`` the settings it resumes with.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import torch

from charlm.runtime.seeds import torch_seed
from charlm.checkpoint import Checkpoint, TrainingState
from charlm.config import RESUMABLE_SETTINGS, TrainConfig
from charlm.errors import CharlmError, ConfigError
from charlm.logs import get_logger
from charlm.runs.directory import Run
from charlm.runtime.distributed import World
from charlm.settings import from_dict


@dataclasses.dataclass
class Progress:
    """Where training stands; everything here goes into the checkpoint."""

    epoch: int = 0  # epochs completed before the current one
    window: int = 0  # next window of the current epoch
    step: int = 0  # optimizer steps so far
    best_valid_bpc: float = math.inf
    best_epoch: int = 0
    best_test_bpc: float | None = None  # test bpc of the best-validation weights, once scored
    wall_seconds: dict = dataclasses.field(default_factory=dict)  # train (completed epochs) / valid / test
    epochs_without_improvement: int = 0
    train_nats: float = 0.0  # this epoch so far
    train_tokens: int = 0
    train_seconds: float = 0.0
    grad_norm_sums: dict = dataclasses.field(default_factory=dict)
    overflowed_steps: int = 0  # this epoch's steps whose gradients were not finite (fp16: skipped by the scaler)
    tokens_seen: int = 0  # training tokens of the whole run, every session (counted from charlm 0.3 on)
    stopped_by: str | None = None  # why training last stopped: epochs, patience, tokens, time
    finished: bool = False
    budget_seconds: float = 0.0  # wall seconds counted against --max-minutes, every session up to this save

    def add_wall(self, part: str, seconds: float) -> None:
        self.wall_seconds[part] = self.wall_seconds.get(part, 0.0) + seconds

    def add_validation(self, epoch_number: int, valid_bpc: float, test_bpc: float | None) -> bool:
        """The end of epoch ``epoch_number`` scored ``valid_bpc`` (and ``test_bpc``, where the test split is
        scored every epoch): the best so far or one more epoch without improvement. Returns whether it improved."""
        improved = valid_bpc < self.best_valid_bpc
        if improved:
            self.best_valid_bpc, self.best_epoch, self.best_test_bpc = valid_bpc, epoch_number, test_bpc
            self.epochs_without_improvement = 0
        else:
            self.epochs_without_improvement += 1
        return improved

    def next_epoch(self) -> None:
        """Past a whole epoch: its sums cleared, its training time in the run's account."""
        self.epoch += 1
        self.window = 0
        self.add_wall("train", self.train_seconds)
        self.train_nats, self.train_tokens, self.train_seconds = 0.0, 0, 0.0
        self.grad_norm_sums, self.overflowed_steps = {}, 0

    def add_update(self, window: int, result, train_seconds: float) -> None:
        """An update (``result``: its step's ``StepResult``) that ended before ``window``: its loss,
        tokens and gradient norms, and the epoch's training seconds so far."""
        self.window = window
        self.step += 1
        self.train_nats += result.loss * result.tokens
        self.train_tokens += result.tokens
        self.tokens_seen += result.tokens
        self.train_seconds = train_seconds
        if all(math.isfinite(norm) for norm in result.grad_norms.values()):
            for name, norm in result.grad_norms.items():
                self.grad_norm_sums[name] = self.grad_norm_sums.get(name, 0.0) + norm
        else:  # an overflow the fp16 scaler skipped: it has no place in the epoch's mean
            self.overflowed_steps += 1


def fixed_settings(changes) -> list[str]:
    """The names among ``changes`` that a resumed run does not let change (its model, its data, its
    optimizer: everything outside ``RESUMABLE_SETTINGS``)."""
    return sorted(set(changes) - set(RESUMABLE_SETTINGS))


def check_resumable(changes) -> None:
    fixed = fixed_settings(changes)
    if fixed:
        raise ConfigError(TrainConfig, fixed[0], "is fixed by the run being resumed; start a new run to change it")


def last_good_checkpoint(run: Run) -> Checkpoint | None:
    """The newest readable checkpoint with training state: last.pt, else previous.pt, else best.pt
    (with a warning naming what could not be read; best.pt keeps no optimizer state, so the
    optimizer starts afresh from it); None when the run has none at all."""
    failures = []
    for path in (run.last, run.previous, run.best):
        if not path.exists():
            if path == run.last and (run.previous.exists() or run.best.exists()):
                failures.append(f"{run.last} is missing")
            continue
        try:
            checkpoint = Checkpoint.load(path)
        except CharlmError as error:
            failures.append(str(error))
            continue
        if checkpoint.training is None:
            failures.append(f"{path} holds no training state")
            continue
        if failures:
            afresh = (
                " (it keeps no optimizer state: the optimizer starts afresh)"
                if checkpoint.training.optimizer is None
                else ""
            )
            get_logger().warning(f"warning: {'; '.join(failures)}: resuming from {path}{afresh}")
        return checkpoint
    if failures:
        raise CharlmError(f"{'; '.join(failures)}; no other checkpoint to resume from")
    return None


IDENTITY_SETTINGS = ("corpus",)  # of config.json's "train", beside its whole "model": what makes the run this run


def check_same_run(run: Run, checkpoint: Checkpoint) -> None:
    """Refuse to resume from a checkpoint of another run: its model, or its corpus, differs from
    the run's config.json (a last.pt of another cell copied in would train half one model and half the other)."""
    try:
        config = run.read_config()  # {} without a config.json
    except CharlmError as error:  # nothing to compare with: the checkpoint is what the run has
        get_logger().warning(f"warning: {error}: {checkpoint.path} is resumed without comparing it with it")
        return
    recorded_model, recorded_train = config.get("model") or {}, config.get("train") or {}
    ours = {
        **checkpoint.model_config.to_dict(),
        **{f"train.{key}": getattr(checkpoint.train_config, key) for key in IDENTITY_SETTINGS},
    }
    theirs = {
        **recorded_model,
        **{f"train.{key}": recorded_train[key] for key in IDENTITY_SETTINGS if key in recorded_train},
    }
    differences = [
        f"{key} {theirs[key]!r} in {run.config_file.name}, {ours[key]!r} in {Path(checkpoint.path).name}"
        for key in ours
        if key in theirs and _plain(theirs[key]) != _plain(ours[key])
    ]
    if differences:
        raise CharlmError(
            f"{checkpoint.path} is not a checkpoint of the run in {run.config_file} ({'; '.join(differences[:3])}): "
            "resume only the run it belongs to"
        )


def check_same_vocabulary(checkpoint: Checkpoint | None, corpus) -> None:
    """Refuse to resume on a corpus whose vocabulary is not the checkpoint's: prepared again under
    its name since the run began (`charlm train --text` after the file changed, say)."""
    if checkpoint is not None and list(corpus.tokenizer.vocab) != list(checkpoint.tokenizer["vocab"]):
        raise CharlmError(
            f"the prepared corpus {corpus.name!r} in {corpus.path} has another vocabulary than "
            f"{checkpoint.path}: it was prepared again since the run began, so the run cannot go on"
        )


def _plain(value):
    """A value as config.json holds it (tuples as lists)."""
    return (
        [_plain(item) for item in value]
        if isinstance(value, (list, tuple))
        else ({key: _plain(item) for key, item in value.items()} if isinstance(value, dict) else value)
    )


def restore_best(run: Run, checkpoint: Checkpoint) -> bool:
    """Finish an epoch's end that a kill cut short after its commit point: ``checkpoint`` (what the
    run resumes from) saved at the end of the best epoch so far carries that epoch's scores; when
    ``best.pt`` does not hold them (missing, unreadable, or another epoch's), ``best.pt`` is written
    from it. Returns whether best.pt was written."""
    scores, progress = checkpoint.scores or {}, checkpoint.training.progress
    if (
        scores.get("epoch") is None
        or scores.get("epoch") != progress.get("best_epoch")
        or scores.get("valid_bpc") != progress.get("best_valid_bpc")
    ):
        return False  # not saved at the end of its best epoch: best.pt was written before it
    try:
        held = Checkpoint.load(run.best).scores if run.best.exists() else {}
    except CharlmError:
        held = {}
    if (held.get("epoch"), held.get("valid_bpc")) == (scores["epoch"], scores["valid_bpc"]):
        return False
    checkpoint.without_optimizer().save(run.best)
    get_logger().warning(
        f"warning: {run.best} did not hold the best epoch ({scores['epoch']}) of "
        f"{checkpoint.path or run.last} (a kill cut its save short): written from it"
    )
    return True


def resumed_config(run: Run, checkpoint: Checkpoint | None, changes: dict) -> TrainConfig:
    """The settings the run in ``run`` goes on with: its checkpoint's (or, stopped before its first
    checkpoint, its config.json's), with ``changes`` to the resumable settings (see ``check_resumable``)."""
    if checkpoint is not None:
        settings = checkpoint.train_config
    else:
        recorded = run.read_config().get("train")  # its types checked: a damaged config.json names itself
        if not recorded:
            raise CharlmError(f"run directory {run.path} holds no checkpoint and no readable config.json to resume")
        try:  # the run's own settings, judged as the file's (not as flags the user gave) before anything is said
            settings = TrainConfig.from_dict(recorded)
            settings.validate()
        except ConfigError as error:
            raise CharlmError(
                f"{run.config_file} holds a setting out of its bounds: {error.field} {error.reason}"
            ) from None
        except CharlmError as error:
            raise CharlmError(f"{run.config_file} holds settings this charlm cannot read ({error})") from None
        get_logger().warning(
            f"warning: {run.path} holds no checkpoint (the run stopped before its first save): "
            "starting it again from the beginning"
        )
    return dataclasses.replace(settings, **{"run_dir": str(run.path), "max_minutes": None, **changes})


def read_progress(checkpoint: Checkpoint) -> Progress:
    """The checkpoint's progress, each value of its field's type and within its range (``progress_problem``)."""
    try:
        progress = from_dict(Progress, checkpoint.training.progress)
    except CharlmError as error:
        raise CharlmError(f"{checkpoint.path}: its training progress is damaged ({error})") from None
    problem = progress_problem(progress)
    if problem:
        raise CharlmError(f"{checkpoint.path}: its training progress is damaged ({problem})")
    return progress


def progress_problem(progress: Progress) -> str | None:
    """What in ``progress`` no training could have reached, or None: a count below zero, a number of
    seconds, nats or bpc that is NaN, infinite or negative (but the best valid bpc, infinite before the
    first evaluation), times and gradient sums that are not such numbers."""
    for field in dataclasses.fields(Progress):
        value = getattr(progress, field.name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 0:
            return f"{field.name} must be a count, not {value}"
        if isinstance(value, float) and not (
            0 <= value < math.inf or (field.name == "best_valid_bpc" and value == math.inf)
        ):
            return f"{field.name} must be a finite number, zero or more, not {value}"
        if isinstance(value, dict) and not all(
            isinstance(key, str) and _is_amount(number) for key, number in value.items()
        ):
            return f"{field.name} must map names to finite numbers, zero or more"
    return None


def _is_amount(value) -> bool:
    """A finite number, zero or more."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf


def restore(
    checkpoint: Checkpoint, config: TrainConfig, model, optimizer, scheduler, world: World, device: torch.device
) -> tuple[Progress, list | None]:
    """Put a checkpoint's weights, optimizer, schedule and RNG streams back; returns its progress
    and this process's share of the carried state (None at an epoch boundary)."""
    saved = checkpoint.training
    model.load_state_dict(checkpoint.weights)
    if saved.optimizer is not None:
        try:  # torch refuses the state of other parameters or groups; charlm, moments of other shapes
            optimizer.load_state_dict(saved.optimizer)
            for parameter, entries in optimizer.state.items():
                for name, value in entries.items():
                    if name != "step" and torch.is_tensor(value) and value.shape != parameter.shape:
                        raise ValueError(
                            f"{name} of shape {list(value.shape)} for a parameter of {list(parameter.shape)}"
                        )
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as error:
            reason = " ".join(str(error).split())[:200] or type(error).__name__
            raise CharlmError(f"{checkpoint.path}: its optimizer state does not fit this run ({reason})") from None
    progress = read_progress(checkpoint)
    if saved.scheduler is not None:
        scheduler.load_state_dict(saved.scheduler)
        if saved.optimizer is None:  # best.pt: a fresh optimizer, at the rate the schedule had reached
            for group, lr in zip(optimizer.param_groups, saved.scheduler.get("_last_lr", ())):
                group["lr"] = lr
    else:  # format 1 kept no scheduler: its rule was lr · decay^epoch
        lr = config.lr * config.lr_decay**progress.epoch
        for group in optimizer.param_groups:
            group["lr"] = lr
        scheduler.load_state_dict(
            {
                "last_epoch": progress.epoch,
                "_step_count": progress.epoch + 1,
                "_last_lr": [lr] * len(optimizer.param_groups),
            }
        )
    restore_random_streams(saved.rng, world, device)
    if saved.hidden is None:
        return progress, None
    rows = world.share(config.batch_size)  # every stream's state was saved: this process carries its share
    return progress, [tuple(t[rows].to(device) for t in layer) for layer in saved.hidden]


def random_streams(world: World, device: torch.device) -> dict:
    """The generators' states to save: the CPU's and, on a GPU, the training device's, of every
    process (``ranks``, in rank order: each draws its own dropout masks)."""
    mine = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        mine["device"] = torch.cuda.get_rng_state(device)
    ranks = world.gather_objects(mine)
    return {"torch": ranks[0]["torch"], "ranks": ranks}


def restore_random_streams(rng: dict, world: World, device: torch.device) -> None:
    """Put back this process's own generator states. A checkpoint from a world of another size (or
    from before ``ranks`` were saved) restores rank 0's CPU stream, and a GPU's where the number of
    devices is unchanged."""
    ranks = rng.get("ranks")
    if ranks is not None and len(ranks) == world.size:
        mine = ranks[world.rank]
        torch.set_rng_state(mine["torch"])
        if mine.get("device") is not None and device.type == "cuda":
            torch.cuda.set_rng_state(mine["device"], device)
        return
    torch.set_rng_state(rng["torch"])
    if rng.get("cuda") and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])


def seed_this_process(seed: int, world: World) -> None:
    """After the weights are made (alike on every process): a random stream of its own for every
    process but the first, so that the processes draw different dropout masks."""
    if world.rank > 0:
        torch.manual_seed(torch_seed(seed + 7919 * world.rank))


def training_checkpoint(
    config: TrainConfig,
    model_config,
    model,
    optimizer,
    scheduler,
    *,
    progress: Progress,
    state: list | None,
    tokenizer,
    provenance: dict,
    world: World,
    device: torch.device,
    scores: dict | None = None,
) -> Checkpoint:
    """A training as it stands, as a checkpoint (weights shared with the live ``model``): ``state``
    is this process's share of the carried state, gathered here from every process with the RNG streams."""
    rng = random_streams(world, device)
    if state is not None:  # every stream's state, gathered from the processes that carry them
        state = [  # cloned: a state that is a view of a window's outputs (a scan's last step) saves only itself
            [world.gather_rows(t.detach(), config.batch_size).cpu().clone() for t in layer] for layer in state
        ]
    training = TrainingState(
        optimizer=optimizer.state_dict(),
        scheduler=scheduler.state_dict(),
        rng=rng,
        progress=dataclasses.asdict(progress),
        hidden=state,
    )
    return Checkpoint(
        model_config=model_config,
        train_config=config,
        tokenizer=tokenizer.to_state(),
        weights=model.state_dict(),
        training=training,
        scores=scores or {},
        provenance=provenance,
    )


def elastic_restart() -> bool:
    """Whether torchrun restarted this process after a failure (``--max-restarts``)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    except ValueError:
        return False


def run_to_go_on_with(settings: dict) -> Path | None:
    """Under ``torchrun --max-restarts``, the same command runs again after a failure: the run it
    started (its ``run_dir`` already holds config.json) is to be resumed, not started anew."""
    run_dir = settings.get("run_dir")
    if run_dir and elastic_restart() and (Path(run_dir) / "config.json").exists():
        return Path(run_dir)
    return None
