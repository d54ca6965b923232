"""torch's process settings for both products: seeds, and the thread count of small networks' forward passes."""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from torch import nn


def seed_everything(seed: int, threads: int = 1) -> torch.Generator:
    """Seed python, numpy and torch; limit torch threads; return a torch generator for sampling."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.set_num_threads(max(1, threads))
    return torch.Generator().manual_seed(seed)


SMALL_NETWORK_PARAMETERS = 1_000_000
"""Below this many parameters a forward pass is faster on one thread than on many (thread start-up dominates)."""


def policy_threads(policy: nn.Module, threads: int | None = None) -> int | None:
    """torch threads for ``policy``'s forward passes: ``threads`` when given; else 1 for a small network unless
    $OMP_NUM_THREADS or $MKL_NUM_THREADS is set (the user chose); None: keep torch's setting."""
    if threads is not None:
        return max(1, int(threads))
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return None
    return 1 if sum(p.numel() for p in policy.parameters()) < SMALL_NETWORK_PARAMETERS else None
