"""Dynamic negative mining (ADMC Algorithm 1, lines 7–10), split into small steps:
index → retrieve → exclude the gold class → report statistics.

Negatives are ranked by the similarity the model predicts with, so the mined ones are the
classes it actually confuses: FAISS inner product on L2-normalised vectors for `cosine`,
on the raw vectors for `inner` (maximum inner-product search), and the model's own scorer
for `mlp`, whose learned term no index can search (exact over the catalog, which is small).
"""

from __future__ import annotations

import functools
import logging
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from importlib import metadata
from typing import TYPE_CHECKING

import numpy as np
import torch

from tqc.metrics import DivergedScores
from tqc.model.similarity import WEIGHT_FREE, scores_directions_only
from tqc.warn_once import ALIKE_EVERY_TRAINING

if TYPE_CHECKING:  # for the annotations only: importing faiss goes through load_faiss, which checks the build
    import faiss

log = logging.getLogger(__name__)


Scorer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # questions (B, D), standards (P, D) → (B, P)


FAISS_BUILDS = ("faiss-cpu", "faiss-gpu-cu12", "faiss-gpu-cu11", "faiss-gpu")  # distributions of the `faiss` package


def load_faiss():
    """The `faiss` package, from one build. faiss-cpu and a GPU build install the same files: with both, Python loads
    the CPU binary (no GPU index, silently) or `import faiss` fails on a symbol the other build's wrapper expects."""
    installed = [name for name in FAISS_BUILDS if _installed(name)]
    if len(installed) > 1:
        raise RuntimeError(f"FAISS: {' and '.join(installed)} are both installed, and they share the `faiss` package; keep "
                           f"one: `pip uninstall -y faiss-cpu` for the GPU index (pyproject.toml's gpu extra)")
    try:
        import faiss
    except (ImportError, OSError) as error:  # OSError: a GPU build's CUDA library missing
        if installed:
            raise ImportError(f"FAISS: {installed[0]} is installed, yet `import faiss` failed: {error}") from error
        raise ImportError("FAISS is not installed: `make run` installs it (FAISS=cpu, or FAISS=gpu on a GPU machine), "
                          "as does `pip install -e '.[cpu]'`") from None
    return faiss


def check_faiss_for(similarity: str, mines_here: bool = True) -> None:
    """Load FAISS now when mining under `similarity` will search an index (every similarity without learned
    weights), so a missing or doubled FAISS is said before the training that mining follows, not after it. Where this
    process mines later (`mines_here`), a GPU build's index is tried now too, before the process starts CUDA: on a GPU
    in exclusive-process mode (common on clusters), the probe's child cannot start CUDA beside a parent that already
    holds the GPU, and mining would fall back to the CPU index for no fault of the build. `tqc stage-one` mines in
    no process of its own, so it tries nothing (the verdict is kept per process)."""
    if similarity not in WEIGHT_FREE:
        return
    faiss = load_faiss()
    if mines_here and _sees_gpus(faiss):
        gpu_index_runs()


def _sees_gpus(faiss) -> bool:
    """Whether `faiss` is a GPU build that sees a GPU (CUDA's device count starts no context on it)."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def build_index(standards: np.ndarray, normalise: bool = True) -> faiss.Index:
    """Exact inner-product index over standard questions (P, D), L2-normalised for cosine; on the GPU when faiss is a
    GPU build that runs there."""
    faiss = load_faiss()
    vectors = np.array(standards, dtype=np.float32, order="C")  # a copy: normalize_L2 works in place
    if normalise:
        faiss.normalize_L2(vectors)
    index = faiss.IndexFlatIP(vectors.shape[1])
    if _sees_gpus(faiss) and gpu_index_runs():
        resources = faiss.StandardGpuResources()
        index = faiss.index_cpu_to_gpu(resources, 0, index)
        # The GPU index uses its resources to its end; whether index_cpu_to_gpu keeps them alive depends on the faiss
        # build, so the index holds them here, by faiss's own convention (its wrappers' referenced_objects)
        index.referenced_objects = [*getattr(index, "referenced_objects", []), resources]
    index.add(vectors)
    return index


# One search on a GPU index, as build_index and retrieve make one: its resources held, as build_index's index holds them
GPU_PROBE = """
import faiss, numpy
resources = faiss.StandardGpuResources()
index = faiss.index_cpu_to_gpu(resources, 0, faiss.IndexFlatIP(4))
index.add(numpy.eye(4, dtype="float32"))
assert (index.search(numpy.eye(4, dtype="float32"), 1)[1].ravel() == numpy.arange(4)).all()
"""
GPU_PROBE_SECONDS = 300  # CUDA's start and one tiny search take seconds; a hung driver is not waited on longer


@functools.cache
def gpu_index_runs() -> bool:
    """Whether this faiss build's GPU index runs on GPU 0 (build_index's: the first CUDA_VISIBLE_DEVICES lists, which
    the child inherits), tried once per process in a child process. A build compiled without the GPU's architecture
    aborts the whole process on its first kernel, which Python cannot catch: PyPI's faiss-gpu-cu12 from 1.9 on stops at
    compute capability 8.9, so on an H100 or H200 it died with "no kernel image is available for execution on the
    device". Then mining searches the CPU index, which is exact too: the same neighbours."""
    try:  # errors="replace": a driver's message in another encoding is still read, not a crash of mining
        probe = subprocess.run([sys.executable, "-c", GPU_PROBE], capture_output=True, text=True, errors="replace",
                               timeout=GPU_PROBE_SECONDS)
    except subprocess.TimeoutExpired:
        reason = f"its probe search did not finish in {GPU_PROBE_SECONDS} s"
    except OSError as error:  # no interpreter to start (sys.executable empty or gone): the CPU index needs none
        reason = f"its probe could not start: {error}"
    else:
        if probe.returncode == 0:
            return True
        reason = f"its probe search exited with status {probe.returncode}" + _said(probe.stderr)
    log.warning("FAISS's GPU index cannot run on this GPU (%s); mining searches the CPU index instead, exact too. "
                "To silence this, install a faiss build with kernels for this GPU (README.md, on FAISS), or faiss-cpu "
                "in its place: `make install FAISS=cpu`.", reason)
    return False


def _said(stderr: str) -> str:
    """The line of a failed probe that says why: faiss's own assertion (an abort prints it first, then perhaps a stack),
    from its "details:" on, else the last line before Python's fault report (PYTHONFAULTHANDLER, inherited, appends
    "Fatal Python error: Aborted", a stack and the extension modules to an abort), else that report's first line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fault = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), len(lines))
    cause = lines[:fault] or lines[fault:fault + 1]
    line = next((line for line in cause if line.startswith("Faiss assertion")), cause[-1] if cause else "")
    return f": {line.partition('details: ')[2] or line}" if line else ""


def retrieve(index: faiss.Index, questions: np.ndarray, depth: int, normalise: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """questions (N, D) → (similarities (N, depth), class indices (N, depth)), nearest first."""
    vectors = np.array(questions, dtype=np.float32, order="C")  # a copy: normalize_L2 works in place
    if normalise:
        load_faiss().normalize_L2(vectors)
    return index.search(vectors, depth)


@torch.no_grad()
def retrieve_by_scorer(scorer: Scorer, questions: np.ndarray, standards: np.ndarray, depth: int,
                       chunk_rows: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """The `retrieve` contract through a learned scorer: exact scores (chunk, P), top `depth` per row."""
    standard_vectors = torch.from_numpy(np.asarray(standards, dtype=np.float32))
    similarities, neighbours = [], []
    for start in range(0, len(questions), chunk_rows):
        chunk = torch.from_numpy(np.asarray(questions[start : start + chunk_rows], dtype=np.float32))
        top = scorer(chunk, standard_vectors).float().cpu().topk(depth, dim=1)  # (chunk, depth), nearest first
        similarities.append(top.values.numpy())
        neighbours.append(top.indices.numpy())
    if not similarities:
        return np.empty((0, depth), np.float32), np.empty((0, depth), np.int64)
    return np.concatenate(similarities), np.concatenate(neighbours)


def nearest(questions: np.ndarray, standards: np.ndarray, depth: int, similarity: str = "cosine",
            scorer: Scorer | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The `depth` highest-scoring standard questions per question under the model's similarity."""
    if similarity in WEIGHT_FREE:
        normalise = scores_directions_only(similarity)
        return retrieve(build_index(standards, normalise), questions, depth, normalise)
    if scorer is None:
        raise ValueError(f"similarity {similarity!r} has learned weights: mining needs the model's scorer")
    return retrieve_by_scorer(scorer, questions, standards, depth)


def largest_group(groups: np.ndarray | None) -> int:
    """The most classes one standard question stands for (1 with no twins): how many of a row's neighbours
    may be its own group's, and so not negatives."""
    return 1 if groups is None else int(np.bincount(groups).max())


def exclude_gold(neighbours: np.ndarray, gold: np.ndarray, k: int, groups: np.ndarray | None = None) -> np.ndarray:
    """neighbours (N, depth ≥ k+1), gold (N,) → the k nearest wrong classes (N, k).

    Retrieving k+1 guarantees k wrong classes remain whether or not gold was retrieved. With `groups` (P,), classes
    that share a standard question (`twins.standard_text_groups`), the gold's whole group is left out, and
    depth ≥ k + the largest group guarantees it.
    """
    own_group = largest_group(groups)
    if neighbours.shape[1] < k + own_group:
        raise ValueError(f"need at least k + {own_group} = {k + own_group} neighbours per row, got {neighbours.shape[1]}")
    wrong = neighbours != gold[:, None] if groups is None else groups[neighbours] != groups[gold][:, None]  # (N, depth)
    # A stable sort on "is gold" keeps the wrong classes in nearest-first order ahead of gold.
    order = np.argsort(~wrong, axis=1, kind="stable")
    return np.take_along_axis(neighbours, order, axis=1)[:, :k]


def mine(questions: np.ndarray, standards: np.ndarray, gold: np.ndarray, k: int, similarity: str = "cosine",
         scorer: Scorer | None = None, groups: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """The k hardest wrong standard questions for each question under `similarity`, and mining statistics. `groups`
    (P,): classes sharing a standard question, none of which is mined for another's questions (`exclude_gold`)."""
    n_classes = standards.shape[0]
    own_group = largest_group(groups)
    if n_classes - own_group < 1:  # the mine stage says so of its catalog first; a direct caller (bench) gets this
        raise ValueError(f"{n_classes} class(es), {n_classes - own_group} of them wrong for the largest group sharing a "
                         "standard question: nothing to mine")
    if k > n_classes - own_group:
        log.warning("mine.k=%d but only %d wrong classes exist; mining %d", k, n_classes - own_group, n_classes - own_group,
                    extra=ALIKE_EVERY_TRAINING)  # the same at every tune trial or evaluate seed: said once there
        k = n_classes - own_group
    elif k == n_classes - own_group and n_classes > 1:  # TREC-6's 6 classes at the default K = 5, say
        log.info("mine.k=%d takes every wrong class there is%s: stage two scores %s against every standard question, so "
                 "mining chooses no subset; a smaller K makes it choose", k,
                 " for a question of the largest group of classes sharing a standard question" if own_group > 1 else "",
                 "such a question" if own_group > 1 else "each question")
    _require_finite(questions, "training question")
    _require_finite(standards, "standard question")
    similarities, neighbours = nearest(questions, standards, min(k + own_group, n_classes), similarity, scorer)
    if (neighbours < 0).any():  # FAISS's "no neighbour" (-1) would index the catalog's last class, perhaps the gold
        rows = np.flatnonzero((neighbours < 0).any(axis=1))
        raise DivergedScores(f"mining found fewer than {neighbours.shape[1]} standard questions for {rows.size} training "
                             f"question(s) (rows {rows[:5].tolist()} first): their scores are not finite")
    negatives = exclude_gold(neighbours, gold, k, groups)
    return negatives, statistics(similarities, neighbours, negatives, gold)


def _require_finite(vectors: np.ndarray, what: str) -> None:
    """A NaN or inf vector (a model diverged on some inputs) scores nothing: FAISS gives it no neighbour (-1), which
    would be written as the catalog's last class, so it is an error naming the rows (0-based: negatives.jsonl's `row`
    for training questions, the catalog's order for standard questions)."""
    rows = np.flatnonzero(~np.isfinite(vectors).all(axis=1))
    if rows.size:
        raise DivergedScores(f"{rows.size} {what} vector(s) hold NaN or inf (rows {rows[:5].tolist()} first): the model "
                             "diverged on them, so no negative can be mined; train it again (a lower learning rate)")


def statistics(similarities: np.ndarray, neighbours: np.ndarray, negatives: np.ndarray, gold: np.ndarray) -> dict:
    gold_found = neighbours == gold[:, None]  # (N, depth)
    gold_rank = np.where(gold_found.any(axis=1), gold_found.argmax(axis=1) + 1, 0)  # 0: beyond depth
    # The hardest mined negative's similarity: not simply the nearest non-gold one, which may be gold's twin
    hardest_at = np.argmax(neighbours == negatives[:, :1], axis=1)  # (N,) its column among the neighbours
    hardest = np.take_along_axis(similarities, hardest_at[:, None], axis=1)[:, 0]
    most_mined = Counter(negatives.ravel().tolist()).most_common(10)
    return {
        "questions": int(len(gold)),
        "k": int(negatives.shape[1]),
        "gold_is_nearest": float(np.mean(gold_rank == 1)),
        "gold_within_depth": float(np.mean(gold_rank > 0)),
        "hardest_negative_similarity_mean": float(np.mean(hardest)),
        "most_mined_classes": [[int(c), int(n)] for c, n in most_mined],
    }
