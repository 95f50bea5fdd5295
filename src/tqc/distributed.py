"""Data-parallel training through torch's own launcher (`torchrun`), one code path for 1..N processes.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; without them this is one process and every
function here is a no-op, so single-process runs are unchanged to the bit. With them:

- each global batch (`batch_size` rows) is split across the processes by `shard`;
- after `backward`, `average_gradients` all-reduces the gradients, so every process takes
  the same optimizer step and the replicas never drift (checked against a single process
  in tests/model/test_distributed.py);
- only rank 0 writes models, reports and tracking runs (`is_main`).

Stage one's in-batch negatives come from each process's share of the batch (as in most multi-GPU
bi-encoder training without an all-gather). Stage two's mined negatives are per question, and with
`negatives: mined_and_in_batch` every process scores its share against the whole batch's classes
(`union_over_processes`), so its gradient is the single-process one exactly, shares of unequal size included
(`share_weight`). NCCL on CUDA, gloo on CPU (`distributed.backend`).

`distributed.nproc_per_node > 1` in params.yaml makes the training stages re-launch themselves
under `python -m torch.distributed.run`; a multi-node job runs `torchrun … -m tqc.cli stage-one …`
directly, and the stages find the environment torchrun made.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def is_main() -> bool:
    return rank() == 0


def active() -> bool:
    """Under torchrun with the process group joined. (torch is imported only when launched, so
    the CLI's other commands start fast.)"""
    if world_size() <= 1:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def check_launch(backend: str, nproc_per_node: int) -> None:
    """What would fail in every process, said in one line before any starts, not as each rank's traceback:
    NCCL needs CUDA, and on a CUDA machine each process trains on its own GPU (LOCAL_RANK), so there can
    be no more processes on a node than GPUs."""
    import torch

    from tqc.config import ConfigError

    check_backend(backend)
    if torch.cuda.is_available() and nproc_per_node > torch.cuda.device_count():
        raise ConfigError(f"distributed.nproc_per_node is {nproc_per_node}, and this machine has "
                          f"{torch.cuda.device_count()} CUDA device(s): each process trains on a GPU of its own, so use at "
                          "most that many (or CUDA_VISIBLE_DEVICES= to train on the CPU with gloo)")


def check_backend(backend: str) -> None:
    """NCCL needs CUDA: said in one line before a process group is joined, not as NCCL's own error."""
    import torch

    from tqc.config import ConfigError

    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError("distributed.backend is 'nccl', which needs a CUDA device, and this machine has none: "
                          "use auto (nccl on GPUs, gloo otherwise) or gloo")


def _check_own_gpu() -> None:
    """Under a torchrun we did not start (multi-node): a LOCAL_RANK with no GPU of its own, named."""
    import torch

    if torch.cuda.is_available() and local_rank() >= torch.cuda.device_count():
        from tqc.config import ConfigError

        raise ConfigError(f"LOCAL_RANK is {local_rank()}, and this node has {torch.cuda.device_count()} CUDA device(s): "
                          "each process trains on a GPU of its own, so torchrun's --nproc_per_node must not exceed them")


def end_with_launcher() -> None:
    """Under torchrun (TORCHELASTIC_RUN_ID, which it sets for its processes): this process gets SIGTERM when
    torchrun ends, however it ended. torchrun starts its processes in sessions of their own and passes SIGTERM on to
    them, but a SIGKILLed torchrun (the OOM killer, a worker's hard cancel) passes on nothing, and they would train
    on, holding their GPUs, for a run nobody waits for, or wait half an hour for its store. Called first thing in
    `cli.main`. Linux only (prctl's PR_SET_PDEATHSIG); elsewhere it does nothing. The signal follows the thread that
    started this process, which in torchrun is its agent's main loop (restarts included), alive as long as the job."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    launcher = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("distributed: prctl(PR_SET_PDEATHSIG) failed (errno %d): this process outlives a killed torchrun",
                    ctypes.get_errno())
        return
    # torchrun ended while the request was made, and no signal will ever come: this process was taken in by init or
    # a subreaper. Told by the parent changing, not by it being init: torchrun as a container's entrypoint is PID 1
    # itself, and every rank killed itself at start. (One that ended before `launcher` was read is not caught.)
    if os.getppid() != launcher:
        os.kill(os.getpid(), signal.SIGTERM)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def setup(backend: str = "auto", timeout_minutes: float = 30.0) -> None:
    """Join the process group torchrun described (no-op for one process or when joined already). A collective waits
    `timeout_minutes` for the other processes, then fails (`distributed.timeout_minutes`)."""
    import torch
    import torch.distributed as dist

    if world_size() <= 1 or dist.is_initialized():
        return
    check_backend(backend)  # the GPU count is _check_own_gpu's, per rank
    cuda = torch.cuda.is_available()
    if cuda:
        _check_own_gpu()
        torch.cuda.set_device(local_rank())
    chosen = ("nccl" if cuda else "gloo") if backend == "auto" else backend
    dist.init_process_group(chosen, timeout=timedelta(minutes=timeout_minutes))
    if not is_main():
        _quiet()
    log.info("distributed: %d processes, backend %s", world_size(), chosen)


def _quiet() -> None:
    """One log and one set of progress bars, rank 0's. Every process does the same work on the same data, so another
    rank's warnings (a loss setting it ignores, classes that share a standard question) and bars (loading the weights,
    encoding for validation) are rank 0's again, once per process; its errors still show."""
    from transformers.utils import logging as transformers_logging

    logging.getLogger("tqc").setLevel(logging.ERROR)
    transformers_logging.disable_progress_bar()


def shard(rows: list[int]) -> list[int]:
    """This process's share of a global batch: every world_size-th row from its rank."""
    return rows[rank() :: world_size()] if active() else rows


def share_weight(share_rows: int, batch_rows: int) -> float:
    """What this process's mean loss over `share_rows` is scaled by, so that `average_gradients`' mean over the
    processes is the mean over the batch's `batch_rows`: share_rows · world_size / batch_rows (1 for one process,
    and for equal shares)."""
    return share_rows * world_size() / batch_rows if active() else 1.0


def broadcast_parameters(model: nn.Module) -> None:
    """Start every replica from rank 0's weights (randomly initialised heads included)."""
    if active():
        import torch.distributed as dist

        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def own_seed(seed: int) -> int:
    """The seed of a random stream each process draws on its own share: `seed` itself in one process, and in rank 0,
    so they draw as before; another rank's is drawn from (seed, rank). Not seed + rank: evaluate's seeds are
    consecutive, so rank 1 of seed 0 would draw rank 0 of seed 1's stream, and two of the runs whose spread is
    reported would share their dropout."""
    if not active() or rank() == 0:
        return seed
    import numpy as np

    return int(np.random.SeedSequence([seed, rank()]).generate_state(1, dtype=np.uint64)[0] >> 1)  # under 2**63


def seed_own_stream(seed: int) -> None:
    """Each process its own torch random stream (`own_seed`), once the replicas hold rank 0's weights: seeded alike,
    the processes drew the same dropout masks and embedding cutoffs for their shares, row for row, so a batch had half
    the noise one process gives it. (One process: untouched, its runs as before.)"""
    if active():
        import torch

        torch.manual_seed(own_seed(seed))


def average_gradients(model: nn.Module) -> None:
    """Mean of every parameter's gradient over the processes, in one all-reduce of all of them
    flattened (one collective per step, not one per tensor). A parameter some process's share never
    reached counts as zero there, so every process sends the same layout; one that no process reached
    (BERT's pooler under mean pooling) is left without a gradient, as one process leaves it, so AdamW
    neither decays nor moves it. The last len(trainable) entries count, per parameter, the processes that had one."""
    if not active():
        return
    import torch
    import torch.distributed as dist

    trainable = [p for p in model.parameters() if p.requires_grad]
    reached = [p.grad is not None for p in trainable]
    device = next((p.grad.device for p in trainable if p.grad is not None), trainable[0].device)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in trainable]
    flags = torch.tensor(reached, dtype=grads[0].dtype, device=device)  # (len(trainable),) 1 where this process has one
    flat = torch.cat([g.reshape(-1) for g in grads] + [flags])  # (total parameters + len(trainable),)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size()
    parts = flat.split([g.numel() for g in grads] + [len(trainable)])
    for parameter, grad, part, anyone in zip(trainable, grads, parts, parts[-1].tolist()):
        parameter.grad = grad.copy_(part.view_as(grad)) if anyone > 0 else None


def mean_over_processes(value: float) -> float:
    """A float averaged over the processes (the epoch's training loss)."""
    if not active():
        return value
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.float64, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item()) / world_size()


def true_in_every_process(flag: bool) -> bool:
    """Whether `flag` holds in every process (a step's loss finite everywhere): a decision every process must take
    alike, since one process skipping a step the others take would leave them waiting in its gradient all-reduce."""
    if not active():
        return flag
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([int(flag)], dtype=torch.int32, device=_collective_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return bool(tensor.item())


def union_over_processes(present: "torch.Tensor") -> "torch.Tensor":
    """present (P,) bool, the classes this process's share holds → (P,) bool, the classes any process's share
    holds: the whole batch's, so a loss over the batch's distinct classes (stage two's in-batch negatives) scores
    every share against the columns one process would (one all-reduce of P bytes a step)."""
    if not active():
        return present
    import torch
    import torch.distributed as dist

    counts = present.to(device=_collective_device(), dtype=torch.int32)  # (P,); gloo and NCCL both sum int32
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return (counts > 0).to(present.device)  # (P,)


def from_main(value):
    """Rank 0's `value` in every process (any picklable object). Decisions every process must take alike (early
    stopping, the best epoch) are taken on it: each process's own figure could differ in a last digit (kernels
    that are not bitwise reproducible across devices), and one process leaving the epoch loop before the others
    would hang them in their next all-reduce."""
    if not active():
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0, device=_collective_device())
    return box[0]


def teardown() -> None:
    if active():
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()


def relaunch_command(nproc_per_node: int, argv: list[str]) -> list[str] | None:
    """The torchrun command that runs this CLI call in `nproc_per_node` processes, or None when
    there is nothing to launch (one process asked for, or already under torchrun)."""
    if nproc_per_node <= 1 or "WORLD_SIZE" in os.environ:
        return None
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc_per_node}",
            "-m", "tqc.cli", *argv]


def launch_environment(nproc_per_node: int, environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment to start a torchrun of `nproc_per_node` processes in: `environment` (default this process's),
    with OMP_NUM_THREADS where it is unset. torchrun sets it to 1 then (and warns), which left all but N of the cores
    idle in a CPU (gloo) run: each process gets its share of the threads one process would use (torch's own count
    here, a thread a core), at least one. A user's OMP_NUM_THREADS, even 1, is theirs and kept."""
    environment = dict(os.environ if environment is None else environment)
    if nproc_per_node > 1 and "OMP_NUM_THREADS" not in environment:
        import torch

        environment["OMP_NUM_THREADS"] = str(max(1, torch.get_num_threads() // nproc_per_node))
    return environment


def _collective_device():
    import torch
    import torch.distributed as dist

    return torch.device("cuda", local_rank()) if dist.get_backend() == "nccl" else torch.device("cpu")
