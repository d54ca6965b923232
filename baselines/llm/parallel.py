"""Data parallelism of ``baselines.llm.train_llm`` across processes (docs/train_llm.md, "Scale-out").

``accelerate launch --multi_gpu --num_processes N -m baselines.llm.train_llm ...`` runs N copies of the loop that train
one set of weights:

- Problems: every process draws the same problem seeds per update (the rollout generator is seeded alike) and
  plays its contiguous share (``DataParallel.share``); a problem's G rollouts stay in one process, so its
  group-relative advantages are those of one process.
- Gradients: each process accumulates its micro-batches locally; ``reduce_gradients`` then sums every trainable
  tensor's gradient over the processes (flat all-reduces of up to ``BUCKET`` elements), before the clipping and the
  optimizer step, which every process takes alike. The loss divides by counts of the whole batch (``sum``), so that
  N processes x B/N problems give the gradient of one process x B problems.
- Start: ``broadcast_parameters`` copies the main process's initial trainable weights (the LoRA initialisation
  draws from each process's own seed) to the others, as DDP does when it wraps a model.

Why not ``accelerator.prepare(model)`` (DDP): the team is one peft model holding one adapter per agent, and
``set_adapter`` switches which adapter's tensors require gradients between micro-batches; DDP registers its
gradient hooks once and expects every process to run the same number of synchronised backward passes over the
same parameters. Here the processes' micro-batch counts per agent differ whenever their problems yield different
numbers of completions, so DDP would need ``find_unused_parameters`` plus ``no_sync`` bookkeeping and could hang on
uneven counts. One explicit all-reduce per optimizer step needs neither, and for LoRA the gradients are a few MB,
so not overlapping the communication with the backward pass costs little.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch

BUCKET = 1 << 24
"""Elements per all-reduce or broadcast (64 MB of float32)."""
TIMEOUT = timedelta(hours=6)
"""How long a process waits at a collective (the others wait while the main process evaluates and saves)."""


def make_accelerator(device: str) -> Any:
    """The run's ``Accelerator`` (``device='cpu'``: CPU processes, gloo), with a long collective timeout."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    return Accelerator(cpu=device == "cpu", kwargs_handlers=[InitProcessGroupKwargs(timeout=TIMEOUT)])


def launched_processes() -> int:
    """How many processes the launcher started (torchrun's ``WORLD_SIZE``, or MPI's), read before any process group
    exists; 1 when started alone."""
    for name in ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"):
        if os.environ.get(name):
            return int(os.environ[name])
    return 1


def check_device(device: str, flag: str) -> None:
    """ValueError naming ``flag`` when ``device`` is not a torch device that exists on this machine."""
    try:
        parsed = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{flag}: {device!r} is not a torch device (e.g. cpu, cuda:0, cuda:1)") from None
    if parsed.type == "cpu":
        return
    module = getattr(torch, parsed.type, None)
    count = 0
    if module is not None and hasattr(module, "is_available") and module.is_available() \
            and hasattr(module, "device_count"):
        count = module.device_count()
    if (parsed.index or 0) >= count:
        raise ValueError(f"{flag}: device {device} is not available on this machine (torch sees {count} "
                         f"{parsed.type} device(s)); give devices that exist, e.g. cpu")


class DataParallel:
    """This process's place among the data-parallel processes and the collectives of the loop (no-ops when alone)."""

    def __init__(self, accelerator: Any = None):
        self.rank = accelerator.process_index if accelerator is not None else 0
        self.world = accelerator.num_processes if accelerator is not None else 1
        self.is_main = accelerator.is_main_process if accelerator is not None else True
        self.device = accelerator.device if accelerator is not None else torch.device("cpu")

    def share(self, count: int) -> range:
        """This process's items of ``count`` (contiguous shares whose sizes differ by at most one)."""
        base, extra = divmod(count, self.world)
        start = self.rank * base + min(self.rank, extra)
        return range(start, start + base + int(self.rank < extra))

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the processes (float64)."""
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on one (a decision the processes must share)."""
        return self.sum([float(flag)])[0] > 0

    def gather(self, value: Any) -> list[Any]:
        """Every process's ``value`` (picklable), in rank order."""
        if self.world == 1:
            return [value]
        import torch.distributed as dist

        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value)
        return values

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def reduce_gradients(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Sum each parameter's gradient over the processes. A parameter without a gradient in every process keeps
        None (as in one process: AdamW skips it); one with a gradient somewhere gets the sum (zeros elsewhere)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        present = self.sum([float(p.grad is not None) for p in parameters])
        used = [p for p, count in zip(parameters, present) if count > 0]
        for bucket in _buckets(used):
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(self.device, torch.float32)
                              for p in bucket])
            dist.all_reduce(flat)
            for p, value in zip(bucket, _pieces(flat, bucket)):
                if p.grad is None:
                    p.grad = value.clone()
                else:
                    p.grad.copy_(value)

    def broadcast_parameters(self, parameters: Sequence[torch.nn.Parameter]) -> None:
        """Copy the main process's values of ``parameters`` to every process."""
        if self.world == 1:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for bucket in _buckets(list(parameters)):
                flat = torch.cat([p.detach().reshape(-1).to(self.device, torch.float32) for p in bucket])
                dist.broadcast(flat, src=0)
                for p, value in zip(bucket, _pieces(flat, bucket)):
                    p.copy_(value)


def _buckets(parameters: Sequence[torch.nn.Parameter]) -> Iterator[list[torch.nn.Parameter]]:
    bucket: list[torch.nn.Parameter] = []
    size = 0
    for p in parameters:
        if bucket and size + p.numel() > BUCKET:
            yield bucket
            bucket, size = [], 0
        bucket.append(p)
        size += p.numel()
    if bucket:
        yield bucket


def _pieces(flat: torch.Tensor, bucket: Sequence[torch.nn.Parameter]) -> Iterator[torch.Tensor]:
    """``flat``'s slices shaped, typed and placed like the parameters of ``bucket``."""
    offset = 0
    for p in bucket:
        yield flat[offset : offset + p.numel()].view(p.shape).to(p.device, p.dtype)
        offset += p.numel()
