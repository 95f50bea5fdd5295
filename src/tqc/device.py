"""One code path for CPU and CUDA: the device and autocast are picked at run time."""

from __future__ import annotations

import random
from contextlib import AbstractContextManager

import numpy as np
import torch


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(device: torch.device) -> AbstractContextManager:
    """bf16 autocast on CUDA; a no-op context on CPU, where bf16 matmuls are slower."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
