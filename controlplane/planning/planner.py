"""The planners: the paper's two-step greedy (``vres_greedy``) and a round-time optimiser across
devices (``vres_sync``), both driven by a fitted throughput predictor.

Notation as in docs/DESIGN.md §1: device ``j`` holds ``|D_ij|`` samples of task ``i``, whose
per-sample training FLOPs are ``F_i``; the plan gives every task a batch size ``B_ij`` and a
share ``R_ij`` (``active_thread_percentage``), and the predictor ``Pre`` gives every co-located
task's throughput ``P_ij`` (samples/s) from all of them at once (Eq. 2 of Yu et al. 2022).

``vres_greedy`` (Yu et al. 2022, §4):

Batch sizes never exceed the largest batch the model was profiled at (predictions past it are
extrapolations) nor the shard.

1. Batch sizes from the data–workload match, Eq. 3: ``min Σ_i | |D_ij|/Σ_k |D_kj| −
   O_ij/Σ_k O_kj |`` with ``O_ij = F_i·B_ij`` is zero when ``B_ij ∝ |D_ij| / F_i``: the task with
   the most data per FLOP gets the largest batch. The closed form fixes ratios, not scale; the
   scale is chosen among :data:`SCALE_BATCHES` (the largest batch of the device), each scale
   taken through step 2 and the best predicted objective kept. Batches are rounded to
   :func:`batch_options` (multiples of 8 in [8, 512], never above the shard) and lowered,
   largest memory first, until the device's predicted memory holds them.
2. Shares by greedy search on a 5 % grid: from the equal split, repeatedly apply the single-task
   share change that most improves the predicted objective (raw ``Σ_i P_ij`` or fair
   ``Σ_i P_ij / P_ij^alone``), until none does. Shares may add up to more than 100 %.

``vres_sync`` (beyond the paper): FL waits for the slowest task on the slowest device, so it
minimises the predicted round time ``T = max_j T_j``, ``T_j = max_i t_ij``, jointly over batch
sizes and shares, under each device's memory. An assignment's seconds are a fixed part and a
per-sample part, ``t_ij = a_ij + E·|D_ij| / P_ij`` (warm-up iterations at the batch's step time,
BatchNorm's pass over the shard, a per-device constant: :mod:`controlplane.planning.seconds`,
fitted on measured seconds), so a few large batches on a small shard are charged their warm-up
steps; ``vres_greedy``'s predicted round time is taken the same way. Devices are independent given their
plans, so minimising each ``T_j`` minimises ``T``. Per device class and model mix, one seeded
pool of candidate configurations is predicted once and scored against every device's data
(vectorised), the device-specific data-matched and baseline plans are added, then every device
is refined by local moves (one task's batch ±8/±32 samples or share ±5/±15 %) in lockstep —
with slack in use, only the devices that can set the round time (within the slack margin of
the slowest), since the others take a relaxed plan anyway.
**Slack**: a device predicted to finish well before the round ends (``T_j < 0.9·T``) takes,
among the candidates it scored, the plan with the most optimizer steps (smaller batches: more
SGD updates for the same epochs) whose predicted time stays within ``0.9·T``; the 10 % margin
keeps a prediction error from making it the new straggler. ``slack="none"`` keeps the fastest
plan. Both planners are deterministic for a given seed.

**Never worse than a baseline** (:func:`never_worse`, applied by
:mod:`controlplane.planning.strategies` to every predictor-driven strategy): the baselines'
plans are predicted with the same predictor and seconds model (:func:`predict_plan`; a
``timeslice`` plan from each task alone and the round-robin law of
:func:`~controlplane.planning.seconds.timeslice_throughput`), and a device whose planned
configuration is predicted worse on the planner's clock than the best baseline's trains that
baseline's configuration instead, with a note saying so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from controlplane.planning.predictor import EncodedMixes, PredictorError, ThroughputPredictor
from controlplane.planning.seconds import SecondsModels, fixed_seconds, timeslice_throughput
from controlplane.planning.types import Plan, PlannedAssignment, PlanningError, PlanningInput

BATCH_STEP = 8
BATCH_MIN = 8
BATCH_MAX = 512
SHARE_STEP = 5
SHARE_GRID = np.arange(SHARE_STEP, 101, SHARE_STEP)
"""The shares the planners choose from, percent: 5, 10, …, 100."""

SCALE_BATCHES = (32, 64, 128, 256, 512)
"""Step 1's candidate scales: the batch size of the device's task with the most data per FLOP."""

SLACK_MARGIN = 0.9
"""A relaxed plan must be predicted to finish within this fraction of the round time."""

POOL_SIZE = 8192
"""Candidate configurations ``vres_sync`` predicts once per device class and model mix."""

_LADDER = np.array([8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512])
_BATCH_MOVES = (-32, -8, 8, 32)
_SHARE_MOVES = (-15, -5, 5, 15)
_MIN_GAIN = 2e-3

Objective = Literal["raw", "fair"]
Slack = Literal["smaller_batches", "none"]
OBJECTIVES: tuple[str, ...] = ("raw", "fair")
SLACK_POLICIES: tuple[str, ...] = ("smaller_batches", "none")


@dataclass(frozen=True)
class DeviceCapacity:
    """What the planner knows about a device's accelerator.

    Attributes:
        predictor: the throughput (and memory) predictor fitted for the device's backend.
        memory_bytes: memory the device's tasks may use together; ``None`` for no limit.
        partitionings: how the device's backend can share it among tasks
            (:data:`~controlplane.planning.types.Partitioning`); a baseline plan the backend
            cannot realise is never chosen for the device (:func:`never_worse`).
    """

    predictor: ThroughputPredictor
    memory_bytes: float | None = None
    partitionings: tuple[str, ...] = ("timeslice", "mps")


@dataclass(frozen=True)
class PlannerContext:
    """What ``vres_*`` need beyond :class:`~controlplane.planning.types.PlanningInput`.

    Attributes:
        architectures: ``task_id → model name`` (a name the predictor knows).
        devices: ``device_id → DeviceCapacity`` for every device of the experiment.
        objective: ``vres_greedy``'s step-2 objective, ``raw`` (Σ P) or ``fair`` (Σ P/P_alone).
        slack: how ``vres_sync`` uses an early device's slack (see the module docstring).
        seed: seeds ``vres_sync``'s candidate pool.
        max_iterations: bound on greedy and refinement passes.
        seconds: each device's seconds model (:mod:`controlplane.planning.seconds`): an
            assignment's time is its fixed part plus ``E·|D_ij| / P_ij``; the prior when
            nothing was measured.
    """

    architectures: Mapping[int, str]
    devices: Mapping[int, DeviceCapacity]
    objective: Objective = "raw"
    slack: Slack = "smaller_batches"
    seed: int = 0
    max_iterations: int = 50
    seconds: SecondsModels = field(default_factory=SecondsModels)


def batch_options(shard: int) -> np.ndarray:
    """Allowed batch sizes for a shard of ``shard`` samples: multiples of :data:`BATCH_STEP` in
    ``[8, min(512, shard)]``; a shard of 2 to 7 samples trains in one batch of all of them.

    Raises:
        PlanningError: a shard of fewer than 2 samples (training-mode BatchNorm needs two).
    """
    if shard < 2:
        raise PlanningError(f"a shard of {shard} sample(s) cannot be trained: at least 2 needed", field="shards")
    if shard < BATCH_MIN:
        return np.array([shard])
    return np.arange(BATCH_MIN, min(BATCH_MAX, shard) + 1, BATCH_STEP)


def _largest_option(shard: np.ndarray) -> np.ndarray:
    return np.where(shard < BATCH_MIN, shard, np.minimum(BATCH_MAX, shard // BATCH_STEP * BATCH_STEP))


def _smallest_option(shard: np.ndarray) -> np.ndarray:
    return np.where(shard < BATCH_MIN, shard, BATCH_MIN)


@dataclass
class _Group:
    """Devices with the same predictor and the same model mix (in the experiment's task order):
    their candidate plans share one predictor call."""

    predictor: ThroughputPredictor
    archs: tuple[str, ...]
    device_ids: list[int] = field(default_factory=list)
    task_ids: list[tuple[int, ...]] = field(default_factory=list)
    samples: list[list[int]] = field(default_factory=list)
    memory: list[float] = field(default_factory=list)
    seconds_models: list[tuple[float, float, float, int]] = field(default_factory=list)

    def finish(self) -> None:
        self.D = np.array(self.samples, dtype=float)  # (n, I)
        # Each device's seconds model (w, β, c, K) as (n, 1) columns beside (n, I) configurations.
        params = np.array(self.seconds_models, dtype=float).reshape(-1, 4)
        self.w, self.beta, self.c, self.K = (params[:, q : q + 1] for q in range(4))
        self.lo = _smallest_option(self.D.astype(int))
        # Plans stay where the predictor has data: no batch above the largest one profiled for
        # the model (rounded down to the batch step), since past it predictions extrapolate.
        profiled = np.array([self.predictor.largest_profiled_batch(a) or BATCH_MAX for a in self.archs])
        trusted = np.maximum(BATCH_MIN, profiled // BATCH_STEP * BATCH_STEP)
        self.hi = np.maximum(self.lo, np.minimum(_largest_option(self.D.astype(int)), trusted[None, :]))
        self.mem_cap = np.array(self.memory, dtype=float)  # (n,)
        space = self.predictor.space
        self.arch_index = np.array([space.architectures.index(a) for a in self.archs])
        self.flops = np.array([space.workloads[a].train_flops_per_sample for a in self.archs])

    @property
    def size(self) -> int:
        return len(self.archs)

    def seconds(self, rows: np.ndarray, batch: np.ndarray, P: np.ndarray, epochs: int) -> np.ndarray:
        """``t_ij = a_ij + E·|D_ij| / P_ij`` (seconds, :mod:`~controlplane.planning.seconds`),
        ``(m, I)``, of configurations ``(m, I)`` (batches ``batch``, throughputs ``P``) on the
        group's devices ``rows`` ``(m,)``."""
        D = self.D[rows]
        fixed = fixed_seconds(
            batch,
            D,
            P,
            epochs,
            warmup_weight=self.w[rows],
            bn_weight=self.beta[rows],
            constant_s=self.c[rows],
            warmup_iterations=self.K[rows],
        )
        out: np.ndarray = fixed + epochs * D / P
        return out

    def predict(self, batch: np.ndarray, share: np.ndarray) -> np.ndarray:
        """Throughput ``(m, I)`` of configurations given as ``(m, I)`` batches and shares.

        Devices of a group often ask for the same configurations (the same pool entries and
        their neighbours): each distinct one is predicted once.
        """
        keys = np.concatenate([batch, share], axis=1)
        unique, inverse = np.unique(keys, axis=0, return_inverse=True)
        k = batch.shape[1]
        if len(unique) < 0.9 * len(keys):
            return self._predict_rows(unique[:, :k], unique[:, k:])[inverse.reshape(-1)]
        return self._predict_rows(batch, share)

    def _predict_rows(self, batch: np.ndarray, share: np.ndarray) -> np.ndarray:
        # As wide as the group's tasks: the predictor pads the design matrix to its own slots.
        m, k = batch.shape
        arch = np.broadcast_to(self.arch_index, (m, k)).astype(np.int64)
        enc = EncodedMixes(self.predictor.space.architectures, arch, batch.astype(float), share.astype(float))
        return self.predictor.predict_arrays(enc)

    def alone(self, batch: np.ndarray) -> np.ndarray:
        """``P_alone`` ``(m, I)``: each task alone on the whole device at its batch size."""
        m, k = batch.shape
        arch = np.tile(self.arch_index, m).astype(np.int64)[:, None]
        b = batch.reshape(-1, 1).astype(float)
        r = np.full((m * k, 1), 100.0)
        enc = EncodedMixes(self.predictor.space.architectures, arch, b, r)
        return self.predictor.predict_arrays(enc)[:, 0].reshape(m, k)

    def memory_of(self, batch: np.ndarray) -> np.ndarray:
        """Predicted peak memory ``(m, I)`` in bytes."""
        return np.stack([self.predictor.memory.predict(a, batch[:, i]) for i, a in enumerate(self.archs)], axis=1)


def _groups(spec: PlanningInput, ctx: PlannerContext) -> list[_Group]:
    """Group the devices and check everything the planners rely on.

    Raises:
        PlanningError: a device without capacity (no predictor), more tasks on a device than
            the predictor encodes, a model the predictor does not know, a shard of one sample,
            a task with no data anywhere, or tasks whose smallest batches do not fit in memory.
    """
    groups: dict[tuple[int, tuple[str, ...]], _Group] = {}
    for task_id in spec.task_ids:
        if task_id not in ctx.architectures:
            raise PlanningError(f"task {task_id} has no model", field="tasks")
        if not any(spec.samples_of(d, task_id) > 0 for d in spec.device_ids):
            raise PlanningError(f"task {task_id} has no data on any device: its shards are all empty", field="shards")
    for device_id in spec.device_ids:
        tasks = spec.tasks_on(device_id)
        if not tasks:
            continue
        if device_id not in ctx.devices:
            raise PlanningError(f"device {device_id} has no fitted predictor for its backend", field="devices")
        capacity = ctx.devices[device_id]
        try:
            capacity.predictor.check_mix_size(len(tasks))
        except PredictorError as exc:
            raise PlanningError(f"device {device_id}: {exc}", field="tasks") from exc
        archs = tuple(ctx.architectures[t] for t in tasks)
        known = capacity.predictor.space.architectures
        for t, a in zip(tasks, archs, strict=True):
            if a not in known:
                raise PlanningError(
                    f"task {t}: model {a!r} is unknown to the predictor (it knows {', '.join(known)}); "
                    "profile it first",
                    field="tasks",
                )
        for t in tasks:
            batch_options(spec.samples_of(device_id, t))
        group = groups.setdefault((id(capacity.predictor), archs), _Group(capacity.predictor, archs))
        group.device_ids.append(device_id)
        group.task_ids.append(tasks)
        group.samples.append([spec.samples_of(device_id, t) for t in tasks])
        group.memory.append(np.inf if capacity.memory_bytes is None else float(capacity.memory_bytes))
        model = ctx.seconds.of(device_id)
        group.seconds_models.append((model.warmup_weight, model.bn_weight, model.constant_s, model.warmup_iterations))
    out = list(groups.values())
    for g in out:
        g.finish()
        try:
            smallest = g.memory_of(g.lo).sum(axis=1)
        except PredictorError as exc:
            raise PlanningError(str(exc), field="tasks") from exc
        for d in np.flatnonzero(smallest > g.mem_cap):
            raise PlanningError(
                f"device {g.device_ids[d]}: its tasks need {smallest[d] / 2**30:.2f} GiB at their smallest batch "
                f"sizes but the device has {g.mem_cap[d] / 2**30:.2f} GiB",
                field="batch_size",
            )
    return out


def _round_time(g: _Group, batch: np.ndarray, P: np.ndarray, epochs: int) -> np.ndarray:
    """``T_j = max_i t_ij`` (seconds) per device of the group, ``t_ij`` its seconds model's."""
    T: np.ndarray = np.max(g.seconds(np.arange(len(g.device_ids)), batch, P, epochs), axis=1)
    return T


def _fit_memory(g: _Group, batch: np.ndarray) -> np.ndarray:
    """Lower batches (largest predicted memory first, one step of 8 at a time) until every
    device's tasks fit; feasibility of the smallest batches was checked by :func:`_groups`."""
    batch = batch.copy()
    for _ in range(BATCH_MAX // BATCH_STEP * g.size):
        mem = g.memory_of(batch)
        over = mem.sum(axis=1) > g.mem_cap
        if not over.any():
            break
        reducible = batch > g.lo
        pick = np.argmax(np.where(reducible, mem, -np.inf), axis=1)
        rows = np.flatnonzero(over)
        batch[rows, pick[rows]] = np.maximum(g.lo[rows, pick[rows]], batch[rows, pick[rows]] - BATCH_STEP)
    return batch


def data_matched_batches(samples: np.ndarray, flops: np.ndarray, largest: int) -> np.ndarray:
    """Step 1 of ``vres_greedy``: the closed form of Eq. 3 (Yu et al. 2022).

    ``B_ij = largest · w_ij / max_k w_kj`` with ``w_ij = |D_ij| / F_i``, rounded to the nearest
    multiple of 8 and clipped to ``[8, min(512, |D_ij|)]`` (a shard under 8 samples: the shard).

    Args:
        samples: ``(n, I)`` shard sizes ``|D_ij|``, each ≥ 2.
        flops: ``(I,)`` training FLOPs per sample ``F_i``.
        largest: the batch size of each device's task with the most data per FLOP.

    Returns:
        ``(n, I)`` integer batch sizes.
    """
    samples = np.asarray(samples, dtype=float)
    w = samples / np.asarray(flops, dtype=float)
    raw = largest * w / w.max(axis=1, keepdims=True)
    rounded = np.rint(raw / BATCH_STEP) * BATCH_STEP
    shard = samples.astype(int)
    batch: np.ndarray = np.clip(rounded, _smallest_option(shard), _largest_option(shard)).astype(int)
    return batch


def _score(g: _Group, batch: np.ndarray, share: np.ndarray, objective: Objective) -> tuple[np.ndarray, np.ndarray]:
    """Predicted objective per row (higher is better) and the predictions ``(m, I)``."""
    P = g.predict(batch, share)
    if objective == "fair":
        return (P / g.alone(batch)).sum(axis=1), P
    return P.sum(axis=1), P


def _greedy_shares(g: _Group, batch: np.ndarray, objective: Objective, max_iterations: int) -> np.ndarray:
    """Step 2 of ``vres_greedy``: steepest single-task share moves on :data:`SHARE_GRID`."""
    n, k = batch.shape
    equal = max(SHARE_STEP, (100 // k) // SHARE_STEP * SHARE_STEP)
    share = np.full((n, k), equal)
    best, _ = _score(g, batch, share, objective)
    active = np.arange(n)
    moves = len(SHARE_GRID) * k
    for _ in range(max_iterations):
        if active.size == 0:
            break
        cand = np.repeat(share[active][:, None, :], moves, axis=1)  # (a, moves, k)
        task = np.repeat(np.arange(k), len(SHARE_GRID))
        cand[:, np.arange(moves), task] = np.tile(SHARE_GRID, k)
        b = np.repeat(batch[active], moves, axis=0)
        score, _ = _score(g, b, cand.reshape(-1, k), objective)
        score = score.reshape(len(active), moves)
        pick = np.argmax(score, axis=1)
        gain = score[np.arange(len(active)), pick] > best[active] * (1 + 1e-9)
        improved = active[gain]
        share[improved] = cand[gain, pick[gain]]
        best[improved] = score[gain, pick[gain]]
        active = improved
    return share


def _assignments(
    g: _Group, batch: np.ndarray, share: np.ndarray, P: np.ndarray, epochs: int
) -> list[PlannedAssignment]:
    t = g.seconds(np.arange(len(g.device_ids)), batch, P, epochs)
    out = []
    for d, device_id in enumerate(g.device_ids):
        for i, task_id in enumerate(g.task_ids[d]):
            out.append(
                PlannedAssignment(
                    device_id=device_id,
                    task_id=task_id,
                    batch_size=int(batch[d, i]),
                    active_thread_percentage=int(share[d, i]),
                    samples=int(g.D[d, i]),
                    predicted_throughput_sps=float(P[d, i]),
                    predicted_seconds=float(t[d, i]),
                )
            )
    return out


def _ordered(spec: PlanningInput, assignments: list[PlannedAssignment]) -> tuple[PlannedAssignment, ...]:
    rank = {(d, t): k for k, (d, t) in enumerate((d, t) for d in spec.device_ids for t in spec.task_ids)}
    return tuple(sorted(assignments, key=lambda a: rank[(a.device_id, a.task_id)]))


def plan_vres_greedy(spec: PlanningInput, ctx: PlannerContext) -> Plan:
    """``vres_greedy``: the paper's two-step greedy (module docstring), every device planned.

    Raises:
        PlanningError: see :func:`_groups`; an unknown objective (``field="objective"``).
    """
    if ctx.objective not in OBJECTIVES:
        raise PlanningError(
            f"objective {ctx.objective!r} is unknown; allowed: {', '.join(OBJECTIVES)}", field="objective"
        )
    assignments: list[PlannedAssignment] = []
    round_time = 0.0
    for g in _groups(spec, ctx):
        best = np.full(len(g.device_ids), -np.inf)
        best_b: np.ndarray | None = None
        best_r: np.ndarray | None = None
        best_p: np.ndarray | None = None
        for largest in SCALE_BATCHES:
            batch = _fit_memory(g, np.minimum(data_matched_batches(g.D, g.flops, largest), g.hi))
            share = _greedy_shares(g, batch, ctx.objective, ctx.max_iterations)
            score, P = _score(g, batch, share, ctx.objective)
            if best_b is None or best_r is None or best_p is None:
                best_b, best_r, best_p = batch, share, P
            better = score > best
            best_b = np.where(better[:, None], batch, best_b)
            best_r = np.where(better[:, None], share, best_r)
            best_p = np.where(better[:, None], P, best_p)
            best = np.maximum(best, score)
        assert best_b is not None and best_r is not None and best_p is not None  # SCALE_BATCHES is not empty
        assignments += _assignments(g, best_b, best_r, best_p, spec.local_epochs)
        round_time = max(round_time, float(_round_time(g, best_b, best_p, spec.local_epochs).max()))
    return Plan(
        strategy="vres_greedy",
        partitioning="mps",
        assignments=_ordered(spec, assignments),
        predicted_round_time_s=round_time,
    )


# ------------------------------------------------------------------------------------ vres_sync


@dataclass
class _SyncState:
    """A group's current plans and the candidates each device scored (for the slack step)."""

    batch: np.ndarray
    share: np.ndarray
    P: np.ndarray
    T: np.ndarray
    cand_batch: list[np.ndarray]
    cand_share: list[np.ndarray]
    cand_P: list[np.ndarray]


def _pool(g: _Group, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``POOL_SIZE`` seeded random configurations: batches from a ladder of multiples of 8,
    shares from :data:`SHARE_GRID`."""
    k = g.size
    batch = _LADDER[rng.integers(0, len(_LADDER), size=(POOL_SIZE, k))]
    share = SHARE_GRID[rng.integers(0, len(SHARE_GRID), size=(POOL_SIZE, k))]
    return batch, share


def _pool_round_times(
    g: _Group, rows: np.ndarray, epochs: int, batch: np.ndarray, P: np.ndarray, mem_total: np.ndarray
) -> np.ndarray:
    """``(len(rows), m)`` round times of ``m`` shared configurations on each device, ``inf``
    where one does not fit (a batch outside the shard's options, or over the memory). Task by
    task, so no ``(rows, m, I)`` array is ever built."""
    T = np.where(mem_total[None, :] <= g.mem_cap[rows][:, None], 0.0, np.inf)
    for i in range(g.size):
        fits = (batch[None, :, i] <= g.hi[rows, i][:, None]) & (batch[None, :, i] >= g.lo[rows, i][:, None])
        D = g.D[rows, i][:, None]
        p = P[None, :, i]
        fixed = fixed_seconds(
            batch[None, :, i],
            D,
            p,
            epochs,
            warmup_weight=g.w[rows],
            bn_weight=g.beta[rows],
            constant_s=g.c[rows],
            warmup_iterations=g.K[rows],
        )
        T = np.maximum(T, np.where(fits, fixed + epochs * D / p, np.inf))
    return T


def _sync_start(g: _Group, epochs: int, rng: np.random.Generator) -> _SyncState:
    """Best of the shared pool, the data-matched plans and the baselines, per device."""
    n, k = g.D.shape
    pool_b, pool_r = _pool(g, rng)
    pool_p = g.predict(pool_b, pool_r)
    pool_mem = g.memory_of(pool_b).sum(axis=1)
    best_t = np.full(n, np.inf)
    best_b = np.zeros((n, k), dtype=int)
    best_r = np.zeros((n, k), dtype=int)
    best_p = np.ones((n, k))
    cand_b, cand_r, cand_p = [], [], []
    chunk = max(1, 2_000_000 // (POOL_SIZE * k))
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk))
        T = _pool_round_times(g, rows, epochs, pool_b, pool_p, pool_mem)  # (rows, POOL)
        pick = np.argmin(T, axis=1)
        best_t[rows] = T[np.arange(len(rows)), pick]
        best_b[rows], best_r[rows], best_p[rows] = pool_b[pick], pool_r[pick], pool_p[pick]
        # Keep each device's 64 fastest pool entries (feasible ones only) for the slack step.
        top = np.argpartition(T, min(63, T.shape[1] - 1), axis=1)[:, :64]
        for r, idx in zip(rows, top, strict=True):
            ok = idx[np.isfinite(T[r - start, idx])]
            cand_b.append(pool_b[ok])
            cand_r.append(pool_r[ok])
            cand_p.append(pool_p[ok])
    # Device-specific starts: data-matched batches at each scale with equal shares, and the
    # paper's baselines (batch 128 clipped, equal shares and 100 % each).
    equal = max(SHARE_STEP, (100 // k) // SHARE_STEP * SHARE_STEP)
    starts = [
        (_fit_memory(g, np.minimum(data_matched_batches(g.D, g.flops, s), g.hi)), np.full((n, k), equal))
        for s in SCALE_BATCHES
    ]
    base_b = _fit_memory(g, np.clip(np.full((n, k), 128), g.lo, g.hi))
    starts += [(base_b, np.full((n, k), equal)), (base_b, np.full((n, k), 100))]
    P_all = g.predict(np.vstack([b for b, _ in starts]), np.vstack([r for _, r in starts]))
    for s, (b, r) in enumerate(starts):
        P = P_all[s * n : (s + 1) * n]
        T = _round_time(g, b, P, epochs)
        better = T < best_t
        best_b[better], best_r[better], best_p[better], best_t[better] = b[better], r[better], P[better], T[better]
    return _SyncState(best_b, best_r, best_p, best_t, cand_b, cand_r, cand_p)


def _sync_refine(g: _Group, state: _SyncState, epochs: int, max_iterations: int, rows: np.ndarray) -> None:
    """Local moves in lockstep over the group's devices ``rows`` until none improves ``T_j``."""
    k = state.batch.shape[1]
    moves = [(i, db, 0) for i in range(k) for db in _BATCH_MOVES] + [
        (i, 0, dr) for i in range(k) for dr in _SHARE_MOVES
    ]
    active = np.asarray(rows)
    for _ in range(max_iterations):
        if active.size == 0:
            break
        b = np.repeat(state.batch[active][:, None, :], len(moves), axis=1)
        r = np.repeat(state.share[active][:, None, :], len(moves), axis=1)
        for m, (i, db, dr) in enumerate(moves):
            b[:, m, i] = np.clip(b[:, m, i] + db, g.lo[active, i], g.hi[active, i])
            r[:, m, i] = np.clip(r[:, m, i] + dr, SHARE_STEP, 100)
        flat_b, flat_r = b.reshape(-1, k), r.reshape(-1, k)
        P = g.predict(flat_b, flat_r)
        T = np.max(g.seconds(np.repeat(active, len(moves)), flat_b, P, epochs), axis=1)
        fits = g.memory_of(flat_b).sum(axis=1) <= np.repeat(g.mem_cap[active], len(moves))
        T = np.where(fits, T, np.inf).reshape(len(active), len(moves))
        pick = np.argmin(T, axis=1)
        best = T[np.arange(len(active)), pick]
        # Moves gaining under 0.2 % are within the predictor's noise; stopping there spares a
        # long tail of passes over a handful of devices.
        gain = best < state.T[active] * (1 - _MIN_GAIN)
        rows = active[gain]
        chosen = np.arange(len(active))[gain] * len(moves) + pick[gain]
        state.batch[rows], state.share[rows] = flat_b[chosen], flat_r[chosen]
        state.P[rows], state.T[rows] = P[chosen], best[gain]
        active = rows


def _sync_slack(g: _Group, state: _SyncState, epochs: int, round_time: float) -> None:
    """Give devices that finish early the plan with the most optimizer steps that is still
    predicted to end within ``SLACK_MARGIN · round_time`` (module docstring)."""
    limit = SLACK_MARGIN * round_time
    for d in np.flatnonzero(state.T < limit):
        b = np.vstack([state.cand_batch[d], state.batch[d][None, :]])
        r = np.vstack([state.cand_share[d], state.share[d][None, :]])
        P = np.vstack([state.cand_P[d], state.P[d][None, :]])
        T = np.max(g.seconds(np.full(len(b), d), b, P, epochs), axis=1)
        steps = np.sum(epochs * np.ceil(g.D[d][None, :] / b), axis=1)
        ok = T <= limit
        # Most steps first, then the faster plan; lexsort's last key is the primary one.
        pick = np.lexsort((T, -steps, ~ok))[0]
        if ok[pick]:
            state.batch[d], state.share[d], state.P[d], state.T[d] = b[pick], r[pick], P[pick], T[pick]


def plan_vres_sync(spec: PlanningInput, ctx: PlannerContext) -> Plan:
    """``vres_sync``: minimise the predicted round time across devices (module docstring).

    Raises:
        PlanningError: see :func:`_groups`; an unknown slack policy (``field="slack"``).
    """
    if ctx.slack not in SLACK_POLICIES:
        raise PlanningError(f"slack {ctx.slack!r} is unknown; allowed: {', '.join(SLACK_POLICIES)}", field="slack")
    rng = np.random.default_rng(ctx.seed)
    groups = _groups(spec, ctx)
    states = [_sync_start(g, spec.local_epochs, rng) for g in groups]
    # Only devices that can set the round time need their fastest plan: the others end with
    # a relaxed plan anyway (slack). Refine those within the slack margin of the slowest, and
    # again whenever refining lowers the round time below a device not refined yet.
    refined = [np.zeros(len(g.device_ids), dtype=bool) for g in groups]
    while True:
        round_time = max((float(s.T.max()) for s in states), default=0.0)
        threshold = SLACK_MARGIN * round_time if ctx.slack == "smaller_batches" else -np.inf
        todo = [np.flatnonzero(~done & (s.T >= threshold)) for done, s in zip(refined, states, strict=True)]
        if not any(len(t) for t in todo):
            break
        for g, state, done, rows in zip(groups, states, refined, todo, strict=True):
            if len(rows):
                _sync_refine(g, state, spec.local_epochs, ctx.max_iterations, rows)
                done[rows] = True
    round_time = max((float(s.T.max()) for s in states), default=0.0)
    assignments: list[PlannedAssignment] = []
    for g, state in zip(groups, states, strict=True):
        if ctx.slack == "smaller_batches":
            _sync_slack(g, state, spec.local_epochs, round_time)
        assignments += _assignments(g, state.batch, state.share, state.P, spec.local_epochs)
    return Plan(
        strategy="vres_sync",
        partitioning="mps",
        assignments=_ordered(spec, assignments),
        predicted_round_time_s=round_time,
    )


PLANNERS = {"vres_greedy": plan_vres_greedy, "vres_sync": plan_vres_sync}
"""The predictor-driven strategies, by name."""


# ------------------------------------------------------------------ never worse than a baseline

Clock = Literal["round_time", "throughput"]
"""What a planner optimises, and so how its plan is judged against a baseline's on a device:
``round_time`` (``T_j = max_i t_ij``, lower is better; ``vres_sync``) or ``throughput`` (the
context's objective, raw ``Σ_i P_ij`` or fair ``Σ_i P_ij / P_ij^alone``, higher is better;
``vres_greedy``)."""
CLOCKS: tuple[str, ...] = ("round_time", "throughput")


def predict_plan(plan: Plan, spec: PlanningInput, ctx: PlannerContext) -> Plan:
    """``plan`` with every assignment's predicted throughput and seconds, from the predictors and
    seconds models the planners use: a device shared by ``mps`` from its predictor at the
    planned shares; a ``timeslice`` device from each task alone on the whole device and the
    round-robin law of :func:`~controlplane.planning.seconds.timeslice_throughput`.
    ``predicted_round_time_s`` becomes ``max_j max_i t_ij``.

    Args:
        plan: a plan of every device–task pair with data (a baseline's, or a planner's).

    Raises:
        PlanningError: as :func:`_groups`; a device–task pair with data missing from the plan
            (``field="plan"``).
    """
    by_key = {(a.device_id, a.task_id): a for a in plan.assignments}
    epochs = spec.local_epochs
    out: list[PlannedAssignment] = []
    for g in _groups(spec, ctx):
        try:
            rows = [[by_key[(d, t)] for t in g.task_ids[r]] for r, d in enumerate(g.device_ids)]
        except KeyError as exc:
            raise PlanningError(f"the plan has no assignment for device and task {exc.args[0]}", field="plan") from None
        batch = np.array([[a.batch_size for a in row] for row in rows], dtype=int)
        share = np.array([[a.active_thread_percentage for a in row] for row in rows], dtype=int)
        sliced = np.array([plan.partitioning_of(d) == "timeslice" for d in g.device_ids])
        P = np.ones(batch.shape)
        if (~sliced).any():
            P[~sliced] = g.predict(batch[~sliced], share[~sliced])
        if sliced.any():
            P[sliced] = timeslice_throughput(batch[sliced], g.D[sliced], g.alone(batch[sliced]), epochs)
        t = g.seconds(np.arange(len(g.device_ids)), batch, P, epochs)
        for r, row in enumerate(rows):
            out += [
                replace(a, predicted_throughput_sps=float(P[r, i]), predicted_seconds=float(t[r, i]))
                for i, a in enumerate(row)
            ]
    ordered = _ordered(spec, out)
    times = [a.predicted_seconds for a in ordered if a.predicted_seconds is not None]
    return replace(plan, assignments=ordered, predicted_round_time_s=max(times, default=0.0))


def _device_values(plan: Plan, spec: PlanningInput, ctx: PlannerContext, clock: Clock) -> dict[int, float]:
    """Each device's predicted figure of ``plan`` (already predicted) on ``clock``."""
    values: dict[int, float] = {}
    per_device: dict[int, list[PlannedAssignment]] = {}
    for a in plan.assignments:
        per_device.setdefault(a.device_id, []).append(a)
    for d, items in per_device.items():
        if clock == "round_time":
            values[d] = max(float(a.predicted_seconds or math.inf) for a in items)
        elif ctx.objective == "fair":
            predictor = ctx.devices[d].predictor
            archs = [ctx.architectures[a.task_id] for a in items]
            alone = alone_throughput(predictor, archs, [a.batch_size for a in items])
            values[d] = float(sum((a.predicted_throughput_sps or 0.0) / p for a, p in zip(items, alone, strict=True)))
        else:
            values[d] = float(sum(a.predicted_throughput_sps or 0.0 for a in items))
    return values


def alone_throughput(predictor: ThroughputPredictor, archs: Sequence[str], batch: Sequence[int]) -> np.ndarray:
    """``P_alone`` ``(I,)``: each task alone on the whole device (share 100) at its batch size."""
    k = len(archs)
    arch = np.array([[predictor.space.architectures.index(a)] for a in archs], dtype=np.int64)
    enc = EncodedMixes(
        predictor.space.architectures, arch, np.array(batch, dtype=float).reshape(k, 1), np.full((k, 1), 100.0)
    )
    out: np.ndarray = predictor.predict_arrays(enc)[:, 0]
    return out


def never_worse(
    plan: Plan,
    baselines: Sequence[Plan],
    spec: PlanningInput,
    ctx: PlannerContext,
    *,
    clock: Clock,
    slack: bool,
) -> Plan:
    """``plan`` with every device whose planned configuration is predicted worse than the best
    baseline's on that device given that baseline's configuration instead (issue 31: a planner
    never chooses a plan predicted slower than a baseline's).

    Every plan is predicted alike (:func:`predict_plan`: the same predictor and seconds model),
    and a baseline is considered on a device only where its backend can realise its
    partitioning (:attr:`DeviceCapacity.partitionings`). On ``clock="round_time"`` a device
    keeps its plan when its ``T_j`` is no larger than the best baseline's, or, with ``slack``
    and the slack policy ``ctx.slack == "smaller_batches"`` (``vres_sync``'s), when it ends within
    :data:`SLACK_MARGIN` of the round time ``max_j min(T_j, T_j^baseline)`` the devices set: a
    device off the critical path may train a slower plan with more optimizer steps. On
    ``clock="throughput"`` it keeps its plan when its objective is no smaller.

    Args:
        plan: the planner's plan.
        baselines: the baselines' plans of the same experiment.
        clock: what the planner optimises (:data:`Clock`).
        slack: the context's slack policy applies (the strategy record's ``slack``).

    Returns:
        The plan, with the baselines' assignments (``partitioning`` set where theirs differs
        from the plan's) on the devices where one is predicted better, a line of ``notes`` for
        each such device, and ``predicted_round_time_s`` over the result.

    Raises:
        PlanningError: as :func:`predict_plan`; an unknown clock (``field="strategy"``).
    """
    if clock not in CLOCKS:
        raise PlanningError(f"clock {clock!r} is unknown; allowed: {', '.join(CLOCKS)}", field="strategy")
    if not baselines:
        return plan
    lower = clock == "round_time"
    mine = predict_plan(plan, spec, ctx)
    own = _device_values(mine, spec, ctx, clock)
    best: dict[int, tuple[float, Plan]] = {}
    for base in baselines:
        predicted = predict_plan(base, spec, ctx)
        for d, value in _device_values(predicted, spec, ctx, clock).items():
            if base.partitioning_of(d) not in ctx.devices[d].partitionings:
                continue
            if d not in best or (value < best[d][0] if lower else value > best[d][0]):
                best[d] = (value, predicted)
    eps = 1e-9
    if lower:
        round_time = max((min(v, best[d][0]) if d in best else v for d, v in own.items()), default=0.0)
        margin = SLACK_MARGIN * round_time if slack and ctx.slack == "smaller_batches" else -math.inf
        worse = {d for d, v in own.items() if d in best and v > best[d][0] * (1 + eps) and v > margin}
    else:
        worse = {d for d, v in own.items() if d in best and v < best[d][0] * (1 - eps)}
    if not worse:
        return mine
    chosen = [a for a in mine.assignments if a.device_id not in worse]
    notes = list(plan.notes)
    unit = "s" if lower else ("fair throughput" if ctx.objective == "fair" else "samples/s")
    for d in sorted(worse, key=spec.device_ids.index):
        value, base = best[d]
        part = base.partitioning_of(d)
        chosen += [replace(a, partitioning=None if part == plan.partitioning else part) for a in base.on_device(d)]
        notes.append(
            f"device {d}: {base.strategy}'s plan is predicted {value:.3g} {unit} against {plan.strategy}'s "
            f"{own[d]:.3g} {unit}: {base.strategy}'s plan is kept there"
        )
    times = [a.predicted_seconds for a in chosen if a.predicted_seconds is not None]
    return replace(
        mine, assignments=_ordered(spec, chosen), predicted_round_time_s=max(times, default=0.0), notes=tuple(notes)
    )
