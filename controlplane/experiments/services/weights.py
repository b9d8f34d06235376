"""Checking the weights files device results point at, before FedAvg reads them.

A device's result names a weights file in the artifact store; the file may be truncated (a full
disk, an agent killed mid-write on a shared folder), not safetensors at all (a pickle, an HTML
error page) or the weights of another model. Each of those must fail that device's assignment
with the reason, so the round goes on as ``partial`` with the other devices, instead of failing
the whole aggregation.

Only the safetensors header is read (:func:`workers.fl.artifacts.read_safetensors_header`: the
safetensors library checks sizes, offsets, dtypes and shapes; no tensor data), and only of
files FedAvg will read: when every device of a task reports the previous global model unchanged
(the ``simulated`` backend passes it through), nothing is read and nothing is checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controlplane.experiments.models import Assignment, Checkpoint
from workers.fl.artifacts import (
    ArtifactStore,
    InvalidSafetensorsError,
    TensorInfo,
    read_safetensors_header,
    tensors_mismatch,
)


def weights_problems(
    *, store: ArtifactStore, assignments: Iterable[Assignment], previous: Mapping[int, Checkpoint]
) -> dict[int, str]:
    """Say which assignments' weights files FedAvg could not use, and why.

    Args:
        store: the artifact store the files are in.
        assignments: succeeded assignments whose ``weights_path`` FedAvg would read.
        previous: the run's newest checkpoint per task id (its global model gives the tensors
            every device's file must hold: names, dtypes and shapes).

    Returns:
        ``{assignment_id: reason}``, one line per unusable file naming it and what is wrong;
        empty when every file is usable.
    """
    by_task: dict[int, list[Assignment]] = {}
    for a in assignments:
        by_task.setdefault(a.task_id, []).append(a)
    problems: dict[int, str] = {}
    for task_id, rows in by_task.items():
        before = previous.get(task_id)
        if before is not None and all(a.weights_sha256 and a.weights_sha256 == before.sha256 for a in rows):
            continue  # the previous global model, unchanged: FedAvg keeps it and reads nothing
        expected = _tensors_or_none(store, before.artifact_path) if before is not None else None
        for a in rows:
            why = _problem(store, a.weights_path, expected)
            if why:
                problems[a.id] = f"weights file {a.weights_path!r} is not usable: {why}"
    return problems


def _problem(store: ArtifactStore, key: str, expected: dict[str, TensorInfo] | None) -> str | None:
    try:
        path = store.path(key)
    except ValueError as exc:  # a key that is not a store key (absolute, '..')
        return str(exc)
    if not path.is_file():
        return "no such file in the artifact store"
    try:
        tensors = read_safetensors_header(path)
    except InvalidSafetensorsError as exc:
        return f"not a valid safetensors file: {exc}"
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    if expected is not None:
        mismatch = tensors_mismatch(expected, tensors)
        if mismatch:
            return f"not this task's model: {mismatch}"
    return None


def _tensors_or_none(store: ArtifactStore, key: str) -> dict[str, TensorInfo] | None:
    """The tensors of the previous global model, or ``None`` if its file cannot be read (then
    devices' files are checked for being well-formed only)."""
    try:
        return read_safetensors_header(store.path(key))
    except (InvalidSafetensorsError, OSError, ValueError):
        return None
