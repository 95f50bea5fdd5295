"""Data-parallel training over NCCL (marker `gpu`): the collectives of `tqc.distributed` on CUDA tensors.

tests/model/test_distributed.py checks the data-parallel arithmetic over gloo on the CPU. NCCL takes only
CUDA tensors and one process per GPU (it refuses two ranks on one device, "Duplicate GPU detected"), so
the same stage-two epoch runs here in one process per GPU of this machine. On a one-GPU machine that is a
group of one: `setup` joins no group for one process (a no-op by design), so the worker joins it by hand
and tells `active` so, and every collective (`broadcast_parameters`, `average_gradients`,
`mean_over_processes`, `from_main`, `teardown`'s barrier) then runs through NCCL.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as multiprocessing

from tests.model.test_distributed import _as_torchrun_rank, _stage_two_weights
from tests.servers import free_port
from tqc import distributed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _deterministic() -> None:
    """The same kernels give the same bits run after run, so a group of one can be held to the single process exactly."""
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.use_deterministic_algorithms(True, warn_only=True)


def _single_process(_index: int, model_dir: str, out_dir: str) -> None:
    _deterministic()
    before, after, _ = _stage_two_weights(model_dir, device="cuda:0")
    torch.save({"before": {k: v.cpu() for k, v in before.items()}, "after": {k: v.cpu() for k, v in after.items()}},
               Path(out_dir) / "single.pt")


def _nccl_worker(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    _as_torchrun_rank(rank, world, port)
    _deterministic()
    if world > 1:
        distributed.setup("nccl")
    else:  # a group of one, joined by hand: see the module's docstring
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
        distributed.active = lambda: True
    try:
        assert dist.get_backend() == "nccl"
        collectives = {"mean_rank": distributed.mean_over_processes(float(rank)),
                       "main_says": distributed.from_main({"rank": rank})}
        weights = _stage_two_weights(model_dir, device=f"cuda:{rank}")[1]
        assert all(v.device == torch.device("cuda", rank) for v in weights.values())
        torch.save({"weights": {k: v.cpu() for k, v in weights.items()}, **collectives}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_stage_two_over_nccl_takes_the_single_process_steps_on_every_gpu(tiny_model_dir, tmp_path):
    world = torch.cuda.device_count()
    multiprocessing.spawn(_single_process, args=(str(tiny_model_dir), str(tmp_path)), nprocs=1, join=True)
    multiprocessing.spawn(_nccl_worker, args=(world, free_port(), str(tiny_model_dir), str(tmp_path)), nprocs=world,
                          join=True)
    single = torch.load(tmp_path / "single.pt")
    saved = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world)]

    assert all(r["mean_rank"] == (world - 1) / 2 for r in saved)  # all-reduced over every GPU
    assert all(r["main_says"] == {"rank": 0} for r in saved)  # rank 0's object, broadcast
    assert any(not torch.equal(single["before"][k], single["after"][k]) for k in single["after"])  # it trained
    # One GPU: the same kernels on the same shares, so the same bits. Several: bf16 on shares of other shapes, held to a
    # quarter of the largest step the single process took. AdamW's step barely depends on the gradient's scale, so that
    # checks the gradients' direction; their scale (a sum, not a mean) is checked over gloo in tests/model.
    moved = max((single["after"][k].float() - single["before"][k].float()).abs().max().item()
                for k in single["after"] if single["after"][k].numel())
    tolerance = 1e-6 if world == 1 else 0.25 * moved
    for name, tensor in single["after"].items():
        assert all(torch.equal(saved[0]["weights"][name], r["weights"][name]) for r in saved), f"replicas differ at {name}"
        difference = (saved[0]["weights"][name].float() - tensor.float()).abs().max().item() if tensor.numel() else 0.0
        assert difference <= tolerance, f"{name}: NCCL's processes differ from one process by {difference:.2e}"
