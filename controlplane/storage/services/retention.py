"""The storage lifecycle of runs' artifacts: the retention policy, disk use, deleting runs and
experiments, and garbage collection (``mtfl gc``).

What a run writes to the artifact store (:mod:`workers.fl.artifacts`, keys under
``runs/<run id>/``):

- ``rounds/<index>/<device>/task-<id>.safetensors``: each device's trained weights of a round
  (:func:`~workers.fl.artifacts.device_weights_key`). Scratch once the round is aggregated:
  nothing reads them again (the aggregation of a round that is redone after a restart reads
  them while the round is ``aggregating`` or ``running``, which the policy never touches).
- ``tasks/<id>/global/``: each task's global model after every round (``round-<index>``), the
  initial model, and a stateful aggregator's server state beside each model
  (:func:`~workers.fl.artifacts.server_state_key`). A :class:`Checkpoint` row names them.

The retention policy (:func:`run_retention_apply`), applied after every aggregated round
(:func:`retention_after_round`, from :func:`controlplane.experiments.services.rounds.advance.round_advance`) and by
:func:`gc` to every finished run:

- the device weights of every round that has ended (``succeeded``, ``partial``, ``failed``,
  ``cancelled``) are deleted, unless the experiment keeps them (``keep_device_weights``, for
  debugging); the row keeps its path and SHA-256 and gets ``weights_deleted_at``;
- of each task's global checkpoints, only these keep their files (:func:`checkpoints_kept`):
  the initial model (agents' uploads are checked against it), the last N rounds'
  (``Experiment.keep_last_checkpoints``, else ``MTFL_KEEP_LAST_CHECKPOINTS``), the best by test
  accuracy, and always the latest — what the next round and a resumed run read, with its
  aggregator's server state. The other rows keep their metrics and get ``deleted_at``.

A file is deleted only when no kept checkpoint names the same path (a round whose model did not
change keeps the previous round's file, and a task no device trained keeps its previous model
and server state), and only when its key is one of the run's own (a path a device reported
somewhere else is never followed). Rows are marked in one transaction before their files go, so
a row never claims a file that was deleted; a file whose deletion failed is found again by
:func:`gc`. Bytes freed count a file once every hard link to it is removed (the ``simulated``
backend links a device's weights to the global model it passed through unchanged).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from controlplane.common.artifact_root import (
    format_bytes,
    local_store,
    run_folder,
    run_folders_remove,
    space_problem,
)
from controlplane.common.errors import ApplicationError
from controlplane.conf import mtfl_setting
from controlplane.experiments.models import (
    ROUND_ENDED,
    RUN_ENDED,
    Assignment,
    Checkpoint,
    Comparison,
    Experiment,
    Run,
)
from controlplane.experiments.selectors import can_manage_experiment
from workers.fl.artifacts import LocalArtifactStore, parse_device_weights_key, validate_key

log = logging.getLogger(__name__)

STALE_TEMP_S = 3600.0
"""A temporary file of an atomic write (``.<name>.<random>.tmp``) older than this is left over
from a writer that died; a younger one may still be moved into place, and is left alone."""

_CHUNK = 500
"""Ids per ``UPDATE ... WHERE id IN (...)`` (SQLite's limit on bound parameters)."""


# --------------------------------------------------------------------------------- the policy


@dataclass(frozen=True)
class CheckpointRow:
    """What the policy reads of one checkpoint: ``round_index`` is ``None`` for the initial model."""

    id: int
    round_index: int | None
    test_accuracy: float | None


def keep_last_checkpoints(experiment: Experiment) -> int:
    """How many rounds' global checkpoints each task of the experiment's runs keeps (the
    experiment's ``keep_last_checkpoints``, else ``MTFL_KEEP_LAST_CHECKPOINTS``)."""
    return int(experiment.keep_last_checkpoints or mtfl_setting("KEEP_LAST_CHECKPOINTS"))


def checkpoints_kept(rows: Iterable[CheckpointRow], keep_last: int) -> set[int]:
    """The ids of one run's and task's checkpoints whose files the policy keeps.

    Kept: the initial model (``round_index`` ``None``); the ``keep_last`` with the highest round
    index; the best by test accuracy (among equals the newest, so it is most often one of the
    last anyway); and the latest by id, which is what
    :func:`controlplane.experiments.selectors.latest_checkpoints` hands the next round and a
    resumed run. Pass the rows not yet deleted: the policy never deletes the best so far, so
    the best among them is the best of all.

    Raises:
        ValueError: ``keep_last`` below 1.
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last}")
    rows = list(rows)
    if not rows:
        return set()
    kept = {r.id for r in rows if r.round_index is None}
    rounds = sorted((r for r in rows if r.round_index is not None), key=lambda r: (r.round_index or 0, r.id))
    kept.update(r.id for r in rounds[-keep_last:])
    kept.add(max(r.id for r in rows))
    scored = [r for r in rounds if r.test_accuracy is not None and math.isfinite(r.test_accuracy)]
    if scored:
        kept.add(max(scored, key=lambda r: (r.test_accuracy, r.id)).id)
    return kept


@dataclass
class Freed:
    """Files (paths removed) and bytes (of files whose last link went) freed, or that would be."""

    files: int = 0
    bytes: int = 0


@dataclass
class _Plan:
    """What applying the policy to one run deletes: rows to mark and files to remove."""

    assignment_ids: list[int] = field(default_factory=list)
    checkpoint_ids: list[int] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)


def _own_key(run_id: int, key: str) -> bool:
    """Whether ``key`` is a valid artifact key inside the run's own folder."""
    try:
        validate_key(key)
    except ValueError:
        return False
    return key.startswith(run_folder(run_id) + "/")


def _is_young_temp(path: Path, now: float) -> bool:
    """A temporary file of an atomic write that may still be moved into place."""
    if not (path.name.startswith(".") and path.name.endswith(".tmp")):
        return False
    try:
        return now - path.lstat().st_mtime < STALE_TEMP_S
    except FileNotFoundError:
        return False


def _files(folder: Path) -> Iterator[Path]:
    """Every regular file under ``folder`` (none when it does not exist); links are not followed.

    ``os.scandir`` tells a file from a folder or a link by the directory entry's type, without
    a ``stat`` per file (a round of 1,000 devices leaves 3,000 files to sweep)."""
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _files(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                yield Path(entry.path)
        except FileNotFoundError:
            continue


def _device_weights_plan(
    run: Run, store: LocalArtifactStore, plan: _Plan, *, sweep_indices: set[int], sweep_all: bool
) -> None:
    """Add the device weights of the run's ended rounds to ``plan``.

    A row's file goes when its path is the key the round gave that device and task; the round
    folders in ``sweep_indices`` (every ended round's when ``sweep_all``) lose every other file
    too (weights of a device whose result was ignored: a straggler, a superseded attempt),
    except temporary files that may still be written.
    """
    rows = (
        Assignment.objects.filter(round__run_id=run.id, round__status__in=ROUND_ENDED, weights_deleted_at__isnull=True)
        .exclude(weights_path="")
        .values_list("id", "round__index", "device__name", "task_id", "weights_path")
    )
    listed: list[str] = []
    for assignment_id, index, device, task_id, key in rows.iterator(chunk_size=2000):
        if parse_device_weights_key(key) != (run.id, index, device, task_id):
            continue  # never follow a path a device reported elsewhere
        plan.assignment_ids.append(assignment_id)
        listed.append(key)
        sweep_indices.add(index)
    rounds_folder = store.path(f"{run_folder(run.id)}/rounds")
    if not rounds_folder.is_dir():
        return  # the rows' files were under it: none exists
    # A folder is swept only once its round has ended (a round without a row has none to wait for).
    in_flight = set(run.rounds.exclude(status__in=ROUND_ENDED).values_list("index", flat=True))
    if sweep_all:
        sweep_indices = {int(p.name) for p in rounds_folder.iterdir() if p.is_dir() and p.name.isdigit()}
    sweep_indices -= in_flight
    now = time.time()
    swept: set[str] = set()
    for index in sorted(sweep_indices):
        for path in _files(rounds_folder / f"{index:05d}"):
            if not _is_young_temp(path, now):  # a row's file (task-<id>.safetensors) never is
                swept.add(str(path))
                plan.paths.append(path)
    # The rows' files the sweep did not list (a round's folder not swept, a link): a Path is
    # built only for those (3,000 per round otherwise; a parsed key is a valid key, so its
    # path is root/key).
    root = str(store.root)
    plan.paths.extend(store.path(key) for key in listed if f"{root}/{key}" not in swept)


def _checkpoints_plan(run: Run, store: LocalArtifactStore, plan: _Plan, *, sweep_all: bool) -> None:
    """Add the run's checkpoints the policy does not keep (:func:`checkpoints_kept`) to ``plan``:
    their rows, and their files no kept checkpoint names. With ``sweep_all`` (a finished run),
    files in the run's ``tasks/`` folder no kept checkpoint names go too (an aggregation that
    wrote its model but never committed it)."""
    keep_last = keep_last_checkpoints(run.experiment)
    rows = list(
        Checkpoint.objects.filter(run_id=run.id, deleted_at__isnull=True).values_list(
            "id", "task_id", "round__index", "test_accuracy", "artifact_path", "server_state_path", "evaluation_status"
        )
    )
    by_task: dict[int, list[CheckpointRow]] = defaultdict(list)
    for ckpt_id, task_id, index, accuracy, _, _, _ in rows:
        by_task[task_id].append(CheckpointRow(ckpt_id, index, accuracy))
    kept: set[int] = set()
    for task_rows in by_task.values():
        kept |= checkpoints_kept(task_rows, keep_last)
    # A model still to be evaluated (beside the next round, services.evaluation) keeps its file
    # until it is: it may turn out the best, and its evaluation reads it.
    kept |= {r[0] for r in rows if r[6] == Checkpoint.Evaluation.PENDING}
    protected = {p for r in rows if r[0] in kept for p in r[4:6] if p}
    candidates: set[str] = set()
    for ckpt_id, _, _, _, model_key, state_key, _ in rows:
        if ckpt_id in kept:
            continue
        plan.checkpoint_ids.append(ckpt_id)
        candidates.update(k for k in (model_key, state_key) if k)
    paths = {store.path(k) for k in candidates if k not in protected and _own_key(run.id, k)}
    if sweep_all:
        keep_paths = {store.path(k) for k in protected if _own_key(run.id, k)}
        now = time.time()
        for path in _files(store.path(f"{run_folder(run.id)}/tasks")):
            if path not in keep_paths and not _is_young_temp(path, now):
                paths.add(path)
    plan.paths.extend(sorted(paths))


def _run_plan(run: Run, store: LocalArtifactStore, *, round_index: int | None = None, sweep_all: bool) -> _Plan:
    plan = _Plan()
    if not run.experiment.keep_device_weights:
        sweep = {round_index} if round_index is not None else set()
        _device_weights_plan(run, store, plan, sweep_indices=sweep, sweep_all=sweep_all)
    _checkpoints_plan(run, store, plan, sweep_all=sweep_all)
    return plan


def _measure(paths: Iterable[Path]) -> tuple[list[Path], Freed]:
    """The paths that exist (each once) and what removing them all frees: a file's bytes count
    once every one of its hard links is among them."""
    existing: list[Path] = []
    links: dict[tuple[int, int], list[int]] = {}  # (device, inode) -> [size, nlink, links removed]
    for path in dict.fromkeys(paths):
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        existing.append(path)
        entry = links.setdefault((st.st_dev, st.st_ino), [st.st_size, st.st_nlink, 0])
        entry[2] += 1
    freed = sum(size for size, nlink, removed in links.values() if removed >= nlink)
    return existing, Freed(files=len(existing), bytes=freed)


def _mark(model, ids: Sequence[int], column: str, now: dt.datetime) -> None:
    for start in range(0, len(ids), _CHUNK):
        model.objects.filter(id__in=ids[start : start + _CHUNK], **{f"{column}__isnull": True}).update(**{column: now})


def _remove(paths: Iterable[Path], top: Path) -> None:
    """Unlink ``paths``, then remove the folders under ``top`` they leave empty, each tried
    once, deepest first (a round of 1,000 devices empties 1,000 device folders and its own:
    removing a folder costs a journaled write, 0.2 to 0.8 ms on the test machine's disk). A
    file that cannot be removed is logged (gc finds it again)."""
    folders: set[Path] = set()
    top_parts = top.parts
    depth = len(top_parts)
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not delete %s: %s", path, exc)
            continue
        # Folders strictly under top only (a path outside it leaves none): compared by parts,
        # since ``top in folder.parents`` compares a Path per level and took most of the time.
        folder = path.parent
        while len(folder.parts) > depth and folder.parts[:depth] == top_parts and folder not in folders:
            folders.add(folder)
            folder = folder.parent
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):  # not empty (or gone already)
            folder.rmdir()


def _apply(run: Run, plan: _Plan, store: LocalArtifactStore, *, dry_run: bool) -> Freed:
    existing, freed = _measure(plan.paths)
    if dry_run:
        return freed
    now = timezone.now()
    with transaction.atomic():
        _mark(Assignment, plan.assignment_ids, "weights_deleted_at", now)
        _mark(Checkpoint, plan.checkpoint_ids, "deleted_at", now)
    _remove(existing, store.path(run_folder(run.id)))
    return freed


def run_retention_apply(*, run_id: int, round_index: int | None = None, dry_run: bool = False) -> Freed:
    """Apply the retention policy to a run (module docstring): delete the device weights of its
    ended rounds (unless the experiment keeps them) and the global checkpoints it does not keep.

    Args:
        run_id: the run.
        round_index: the round that just ended: its folder is swept of every file, not only of
            those its rows name (weights a device sent after its result was ignored).
        dry_run: only measure what would be freed.

    Returns:
        What was (or would be) freed.

    Raises:
        Run.DoesNotExist: no such run.
    """
    run = Run.objects.select_related("experiment").get(id=run_id)
    store = local_store()
    return _apply(run, _run_plan(run, store, round_index=round_index, sweep_all=False), store, dry_run=dry_run)


def retention_after_round(run_id: int, round_index: int) -> None:
    """:func:`run_retention_apply` after a round of the run ended and its checkpoints were
    committed (called from :func:`controlplane.experiments.services.rounds.advance.round_advance`). A failure here is logged and
    never fails the run: what is left is freed by the next round or by :func:`gc`."""
    try:
        freed = run_retention_apply(run_id=run_id, round_index=round_index)
    except Exception:  # noqa: BLE001 - retention must never hold up or fail the run
        log.exception("run %s: the retention policy failed after round %s", run_id, round_index)
        return
    if freed.files:
        log.info(
            "run %s round %s: retention freed %s in %d files",
            run_id,
            round_index,
            format_bytes(freed.bytes),
            freed.files,
        )


# --------------------------------------------------------------------------------- free space


# ------------------------------------------------------------------------------------ disk use


@dataclass(frozen=True)
class DiskUse:
    """Files under a folder and their bytes (a file with several hard links counted once)."""

    files: int
    bytes: int


def _disk_use(folders: Iterable[Path]) -> DiskUse:
    sizes: dict[tuple[int, int], int] = {}
    files = 0
    for folder in folders:
        for path in _files(folder):
            try:
                st = path.lstat()
            except FileNotFoundError:
                continue
            files += 1
            sizes[(st.st_dev, st.st_ino)] = st.st_size
    return DiskUse(files=files, bytes=sum(sizes.values()))


def experiments_disk_use(experiment_ids: Iterable[int]) -> dict[int, DiskUse]:
    """``{experiment id: DiskUse}``: the files the experiments' runs still hold in the artifact
    store (their ``runs/<id>/`` folders, walked now), one query for the runs."""
    ids = list(experiment_ids)
    runs: dict[int, list[int]] = {i: [] for i in ids}
    for run_id, experiment_id in Run.objects.filter(experiment_id__in=ids).values_list("id", "experiment_id"):
        runs[experiment_id].append(run_id)
    store = local_store()
    return {i: _disk_use(store.path(run_folder(r)) for r in run_ids) for i, run_ids in runs.items()}


def run_disk_use(run_id: int) -> DiskUse:
    """The files a run holds in the artifact store."""
    return _disk_use([local_store().path(run_folder(run_id))])


@dataclass(frozen=True)
class StorageTotals:
    """The whole artifact store: its folder, what it holds (runs' artifacts, predictors, anything
    else) and the free space of its file system, against the threshold below which rounds
    refuse to start."""

    root: Path
    files: int
    bytes: int
    free_bytes: int
    min_free_bytes: int

    @property
    def problem(self) -> str | None:
        """:func:`controlplane.common.artifact_root.storage_space_problem`'s message for these figures (``None``: rounds start)."""
        return space_problem(self.root, self.free_bytes, self.min_free_bytes)


def storage_totals() -> StorageTotals:
    """The artifact store's size (walked now) and its file system's free space."""
    root = local_store().root
    use = _disk_use([root])
    return StorageTotals(
        root=root,
        files=use.files,
        bytes=use.bytes,
        free_bytes=shutil.disk_usage(root).free,
        min_free_bytes=int(mtfl_setting("MIN_FREE_BYTES")),
    )


# ------------------------------------------------------------------------------------ deleting


def _in_progress(runs) -> list[int]:
    return sorted(runs.filter(status__in=[Run.Status.PENDING, Run.Status.RUNNING]).values_list("id", flat=True))


def run_delete(*, run: Run, actor=None) -> DiskUse:
    """Delete a finished run: its rows (rounds, assignments and the profile samples measured
    from them, checkpoints, telemetry; its device leases stay, without run and round, as its
    owner's device-time for the fair policy) and, once that commits, its artifact folder.

    Args:
        actor: the user asking; ``None`` (the command line) may delete any run.

    Returns:
        What its artifact folder held.

    Raises:
        ApplicationError: 403 when ``actor`` is not the experiment's owner (or a superuser);
            409 while the run is pending or running (cancel it first).
    """
    if actor is not None and not can_manage_experiment(actor, run.experiment):
        raise ApplicationError("only the experiment's owner can delete its runs", status_code=403)
    blocked = f"run {run.id} is {{}}: cancel it first (POST /api/runs/{run.id}/cancel/), then delete it"
    if run.status not in RUN_ENDED:
        raise ApplicationError(blocked.format(run.status), field="status", status_code=409)
    held = run_disk_use(run.id)
    with transaction.atomic():
        deleted, _ = Run.objects.filter(id=run.id, status__in=RUN_ENDED).delete()
        if not deleted:
            current = Run.objects.filter(id=run.id).values_list("status", flat=True).first() or "gone"
            raise ApplicationError(blocked.format(current), field="status", status_code=409)
        run_id = run.id
        transaction.on_commit(lambda: run_folders_remove([run_id]))
    return held


def experiment_delete(*, experiment: Experiment, actor=None) -> DiskUse:
    """Delete an experiment whose runs have all ended: its rows (shards, comparisons, runs and
    everything below them; its tasks stay in the catalogue) and, once that commits, its runs'
    artifact folders.

    Args:
        actor: the user asking; ``None`` (the command line) may delete any experiment.

    Returns:
        What its runs' artifact folders held.

    Raises:
        ApplicationError: 403 when ``actor`` is not its owner (or a superuser); 409 while one
            of its runs is pending or running, or a comparison is still running.
    """
    if actor is not None and not can_manage_experiment(actor, experiment):
        raise ApplicationError("only the experiment's owner can delete it", status_code=403)
    with transaction.atomic():
        busy = _in_progress(Run.objects.filter(experiment=experiment))
        if busy:
            raise ApplicationError(
                f"experiment {experiment.id} has runs in progress ({', '.join(map(str, busy))}): cancel them "
                "first (POST /api/runs/{id}/cancel/), then delete it",
                field="runs",
                status_code=409,
            )
        comparing = list(experiment.comparisons.filter(status=Comparison.Status.RUNNING).values_list("id", flat=True))
        if comparing:
            raise ApplicationError(
                f"experiment {experiment.id} has comparison {comparing[0]} running: cancel it first "
                f"(POST /api/comparisons/{comparing[0]}/cancel/), then delete it",
                field="comparisons",
                status_code=409,
            )
        run_ids = list(experiment.runs.values_list("id", flat=True))
        held = experiments_disk_use([experiment.id])[experiment.id]
        Experiment.objects.filter(id=experiment.id).delete()
        transaction.on_commit(lambda: run_folders_remove(run_ids))
    return held


# ------------------------------------------------------------------------------------------ gc


@dataclass
class GcEntry:
    """What :func:`gc` frees of one experiment's runs (``experiment_id`` ``None``: folders of
    runs that no longer exist)."""

    experiment_id: int | None
    experiment_name: str
    runs: int = 0
    files: int = 0
    bytes: int = 0


@dataclass
class GcReport:
    """What :func:`gc` freed (``dry_run``: would free), per experiment and in total."""

    dry_run: bool
    entries: list[GcEntry]

    @property
    def files(self) -> int:
        return sum(e.files for e in self.entries)

    @property
    def bytes(self) -> int:
        return sum(e.bytes for e in self.entries)


def gc(*, dry_run: bool) -> GcReport:
    """Apply the retention policy to every finished run (those from before it existed too) and
    remove the artifact folders of runs that no longer exist.

    On a finished run, beyond what :func:`run_retention_apply` does after each round: every
    ended round's folder is emptied (unless the experiment keeps device weights) and files in
    its ``tasks/`` folder that no kept checkpoint names are removed. Runs in progress are left
    to the policy their rounds apply.

    Args:
        dry_run: measure only; nothing is marked or removed.

    Returns:
        Per experiment with something to free (in id order; orphan folders last): its runs
        concerned, files and bytes.
    """
    store = local_store()
    entries: dict[int | None, GcEntry] = {}
    runs = Run.objects.filter(status__in=RUN_ENDED).select_related("experiment").order_by("experiment_id", "id")
    for run in runs.iterator(chunk_size=200):
        freed = _apply(run, _run_plan(run, store, sweep_all=True), store, dry_run=dry_run)
        if freed.files:
            entry = entries.setdefault(run.experiment_id, GcEntry(run.experiment_id, run.experiment.name))
            entry.runs += 1
            entry.files += freed.files
            entry.bytes += freed.bytes
    runs_root = store.path("runs")
    names = [p for p in runs_root.iterdir() if p.is_dir() and p.name.isdigit()] if runs_root.is_dir() else []
    known = set(Run.objects.filter(id__in=[int(p.name) for p in names]).values_list("id", flat=True))
    orphans = [p for p in names if int(p.name) not in known]
    if orphans:
        use = _disk_use(orphans)
        entries[None] = GcEntry(None, "(runs that no longer exist)", len(orphans), use.files, use.bytes)
        if not dry_run:
            for folder in orphans:
                shutil.rmtree(folder, ignore_errors=True)
    ordered = sorted(entries.values(), key=lambda e: (e.experiment_id is None, e.experiment_id or 0))
    return GcReport(dry_run=dry_run, entries=ordered)


def storage_overview(experiments: Iterable[Experiment]) -> dict:
    """The artifact store's totals (:func:`storage_totals`), why rounds refuse to start now
    (:func:`controlplane.common.artifact_root.storage_space_problem`, ``None`` when they do not) and what each of ``experiments``
    holds, largest first: the body of ``GET /api/storage/``."""
    names = {e.id: e.name for e in experiments}
    use = experiments_disk_use(names)
    totals = storage_totals()
    rows = [{"experiment": i, "name": names[i], "files": u.files, "bytes": u.bytes} for i, u in use.items()]
    return {
        "artifact_root": str(totals.root),
        "files": totals.files,
        "bytes": totals.bytes,
        "free_bytes": totals.free_bytes,
        "min_free_bytes": totals.min_free_bytes,
        "problem": totals.problem,
        "experiments": sorted(rows, key=lambda r: (-r["bytes"], r["experiment"])),
    }
