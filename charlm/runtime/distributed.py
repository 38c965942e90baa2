"""Training across processes with ``torchrun`` (DistributedDataParallel).

charlm never starts processes itself: ``torchrun`` does, and sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` in each one's environment. :func:`world_from_environment` reads them, joins the
process group (NCCL on CUDA, gloo on the CPU) and returns the :class:`World` the trainer asks
about ranks and collective sums. Outside torchrun it returns the world of one process, whose
methods are plain local operations.

The B parallel streams of a batch are dealt out as contiguous shares, one per rank; a batch that
does not divide evenly gives the first B mod W ranks one stream more::

    streams  0 1 2 3 4 5 6 7 8 9     B = 10, W = 4
    rank     0 0 0 1 1 1 2 2 3 3     shares 3, 3, 2, 2

A process that freezes (rather than dies) would hold the others at their next collective for
PyTorch's default 30 minutes. ``--dist-timeout`` (``TrainConfig.dist_timeout``, 10 minutes by
default) is the process group's timeout instead: a process that waited that long for the others
stops with one line naming the option (gloo raises in the waiting process; on NCCL, PyTorch's
watchdog ends it). Joining the group waits at most as long; finding torchrun's store, 30 minutes.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re

import torch
import torch.distributed as dist

from charlm.config import DIST_TIMEOUT_MINUTES
from charlm.errors import CharlmError

STORE_TIMEOUT = datetime.timedelta(minutes=30)  # reaching torchrun's store: a process may still be starting
TIMED_OUT = re.compile(r"timed?[ _-]?out", re.IGNORECASE)  # gloo: "Timed out waiting 5000ms for recv operation"


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place among those training one model."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    timeout_minutes: float = DIST_TIMEOUT_MINUTES  # --dist-timeout: how long a collective waits for the others

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the run directory and talks to the user."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def share(self, count: int, rank: int | None = None) -> slice:
        """The contiguous rows of ``count`` that ``rank`` (default: this one) carries."""
        rank = self.rank if rank is None else rank
        base, extra = divmod(count, self.size)
        start = rank * base + min(rank, extra)
        return slice(start, start + base + (1 if rank < extra else 0))

    def sum(self, values: list[float]) -> list[float]:
        """Each value summed over the ranks (float64)."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(values, dtype=torch.float64, device=self._device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on one."""
        return self.sum([1.0 if flag else 0.0])[0] > 0

    def gather_rows(self, tensor: torch.Tensor, count: int) -> torch.Tensor:
        """Every rank's share of rows stacked in rank order into the ``count`` rows of the batch."""
        if not self.distributed:
            return tensor
        widest = self.share(count, 0).stop  # rank 0's share is the largest
        padded = tensor.new_zeros((widest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
        pieces = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(pieces, padded)
        shares = [self.share(count, rank) for rank in range(self.size)]
        return torch.cat([piece[: share.stop - share.start] for piece, share in zip(pieces, shares)])

    def gather_objects(self, value) -> list:
        """Every rank's ``value`` (any picklable object), in rank order, on every rank."""
        if not self.distributed:
            return [value]
        gathered = [None] * self.size
        dist.all_gather_object(gathered, value)
        return gathered

    def broadcast(self, value):
        """Rank 0's ``value`` (any picklable object), on every rank."""
        if not self.distributed:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def lost_peer(self, error: BaseException, detail: str) -> str:
        """Why a collective of this process failed, in words: the others did not answer within
        --dist-timeout (one froze, or was slower than the timeout allows), or one failed or was lost."""
        if TIMED_OUT.search(str(error)):
            return (
                f"process {self.rank} of {self.size} waited --dist-timeout {self.timeout_minutes:g} minutes for "
                "the others and stopped: one of them froze or was lost (if they were only slow, as when saving a "
                "large checkpoint, give a larger --dist-timeout)"
            )
        return f"a process of this training failed or was lost ({detail})"

    def leave(self, together: bool = True) -> None:
        """Leave the process group. ``together``: every process got here normally, so they first
        wait for each other (a process that tears its connections down while a peer is still
        using them can make that peer abort); after a failure each leaves on its own."""
        if not (self.distributed and dist.is_initialized()):
            return
        if together:
            dist.barrier()
        dist.destroy_process_group()

    def _device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def launched_by_torchrun() -> bool:
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def environment_rank() -> int:
    """This process's rank as torchrun set it (0 outside torchrun), before the group is joined."""
    try:
        return int(os.environ.get("RANK", "0")) if launched_by_torchrun() else 0
    except ValueError:
        return 0


def world_from_environment(device: torch.device, timeout_minutes: float = DIST_TIMEOUT_MINUTES) -> World:
    """The world torchrun set up (joining its process group, whose collectives wait at most
    ``timeout_minutes`` for the others), or the world of this process alone."""
    if not launched_by_torchrun():
        return World()
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise CharlmError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (they are set by torchrun)") from None
    if size < 1 or not 0 <= rank < size or local_rank < 0:
        raise CharlmError(
            f"RANK {rank}, WORLD_SIZE {size} and LOCAL_RANK {local_rank} name no process: RANK must be "
            "from 0 to WORLD_SIZE - 1 and LOCAL_RANK 0 or more (they are set by torchrun)"
        )
    if size == 1:
        return World()
    if not dist.is_available():
        raise CharlmError("this torch was built without torch.distributed; it cannot train under torchrun")
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(local_rank)
        timeout = datetime.timedelta(minutes=timeout_minutes)
        try:
            store, _, _ = next(dist.rendezvous("env://", rank, size, timeout=STORE_TIMEOUT))
        except (
            ValueError,
            RuntimeError,
        ) as error:  # MASTER_ADDR unset, its port taken: torch's DistError is a RuntimeError
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CharlmError(
                f"process {rank} of {size} cannot reach the others (MASTER_ADDR, MASTER_PORT: set by torchrun): {first}"
            ) from None
        # torchrun --max-restarts keeps its store across restarts: the processes of a new attempt
        # would read the addresses the failed attempt's processes left in it, and wait on the dead
        # ones. Each attempt's keys get a prefix of their own.
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        store = dist.PrefixStore(f"charlm/attempt-{attempt}", store)
        try:
            dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
        except RuntimeError as error:  # torch's DistError and its kinds are RuntimeErrors
            if not TIMED_OUT.search(str(error)):
                raise
            raise CharlmError(
                f"process {rank} of {size} waited --dist-timeout {timeout_minutes:g} minutes for the "
                "others to join the training and stopped: one of them froze, failed or is still "
                "starting (give a larger --dist-timeout if they start slowly)"
            ) from None
    return World(rank, size, local_rank, timeout_minutes)


def device_for_rank(device: torch.device, world: World) -> torch.device:
    """Each process on a node takes its own GPU: ``cuda`` becomes ``cuda:LOCAL_RANK``."""
    if device.type == "cuda" and world.distributed:
        return torch.device("cuda", world.local_rank)
    return device
