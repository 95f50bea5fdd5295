"""One code path for CPU and CUDA: the device and autocast are picked at run time."""

from __future__ import annotations

import random
from contextlib import AbstractContextManager

import numpy as np
import torch

from tqc import distributed


def pick_device() -> torch.device:
    """CUDA when present (the process's own GPU under torchrun: LOCAL_RANK), else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", distributed.local_rank())
    return torch.device("cpu")


def autocast(device: torch.device) -> AbstractContextManager:
    """bf16 autocast on CUDA; a no-op context on CPU, where bf16 matmuls are slower."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def wait_for(device: torch.device) -> None:
    """Returns once `device` has done all the work queued on it: a CUDA call returns once its kernels are queued, so
    a clock read without this leaves out whatever is still queued (an epoch's last backward pass and step)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
