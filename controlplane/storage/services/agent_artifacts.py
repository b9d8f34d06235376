"""Weights that cross the wire between a device's agent and the control plane.

An agent that shares no disk with the control plane (``MTFL_CONTROL_URL``) fetches the global
models its assignments start from and sends back the weights it trained, through
``/api/agent/artifacts/<key>`` (:mod:`controlplane.api.agent_views`). ``ARTIFACT_ROOT`` stays
the store: an upload lands at the very key a shared-disk agent would have written
(:func:`workers.fl.artifacts.device_weights_key`), so FedAvg reads it from there either way.

What a device may touch, decided here and nowhere else:

- download: a global model (:func:`workers.fl.artifacts.global_weights_key`) that is a checkpoint
  of a run and task for which the device has an assignment in a round still running;
- upload: the trained-weights key of one of the device's own assignments, while its round is
  still running; the file must be a well-formed safetensors file with exactly the tensors
  (names, dtypes, shapes) of the task's model. Nothing is ever unpickled or loaded as tensors.

Everything else is 404 (the device learns nothing about other devices' work). Uploads are
streamed to a temporary file beside the target in chunks, hashed on the way, size-limited
(``MTFL_MAX_ARTIFACT_BYTES``) and moved into place atomically only once every check passed.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import BinaryIO

from controlplane.common.errors import ApplicationError
from controlplane.conf import mtfl_setting
from controlplane.experiments.models import Assignment, Checkpoint, Round
from controlplane.fleet.models import Device
from workers.fl.artifacts import (
    InvalidSafetensorsError,
    TensorInfo,
    atomic_write_path,
    get_store,
    parse_device_weights_key,
    parse_global_weights_key,
    read_safetensors_header,
    tensors_mismatch,
)

CHUNK_BYTES = 1 << 20
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def _not_found(key: str) -> ApplicationError:
    return ApplicationError(f"no artifact {key!r} for this device", field="key", status_code=404)


def agent_artifact_for_download(*, device: Device, key: str) -> tuple[Path, str]:
    """Return the local path and hex SHA-256 of a global model ``device`` needs.

    Raises:
        ApplicationError: 404 unless ``key`` is a global model of a run and task the device
            has an assignment for in a running round, and the file is in the store.
    """
    parsed = parse_global_weights_key(key)
    if parsed is None:
        raise _not_found(key)
    run_id, task_id, _ = parsed
    needed = Assignment.objects.filter(
        device=device, task_id=task_id, round__run_id=run_id, round__status=Round.Status.RUNNING
    ).exists()
    checkpoint = Checkpoint.objects.filter(run_id=run_id, task_id=task_id, artifact_path=key).first()
    if not needed or checkpoint is None:
        raise _not_found(key)
    path = get_store().path(key)
    if not path.is_file():
        raise ApplicationError(
            f"artifact {key!r} is missing from the control plane's store", field="key", status_code=404
        )
    return path, checkpoint.sha256


def _open_assignment(device: Device, key: str) -> Assignment:
    """The device's assignment whose trained weights go to ``key``, its round still running."""
    parsed = parse_device_weights_key(key)
    if parsed is None:
        raise _not_found(key)
    run_id, round_index, device_name, task_id = parsed
    if device_name != device.name:
        raise _not_found(key)
    assignment = (
        Assignment.objects.select_related("round")
        .filter(device=device, task_id=task_id, round__run_id=run_id, round__index=round_index)
        .first()
    )
    if assignment is None:
        raise _not_found(key)
    if assignment.round.status != Round.Status.RUNNING:
        raise ApplicationError(
            f"round {round_index} of run {run_id} is {assignment.round.status}: it no longer takes weights",
            field="key",
            status_code=409,
        )
    return assignment


def agent_artifact_upload(
    *, device: Device, key: str, body: BinaryIO, content_length: int | None, sha256: str
) -> tuple[str, int]:
    """Store the weights ``device`` trained for one of its assignments under ``key``.

    The body is read in chunks of :data:`CHUNK_BYTES` into a temporary file beside the target
    and hashed on the way; only after the size, the SHA-256, the safetensors header and the
    tensors (against the task's initial model of the run) have been checked, and the round is
    still running, is it moved onto ``key`` (``os.replace``). A repeated upload replaces the
    previous one.

    Args:
        device: the device the agent token belongs to.
        key: the assignment's ``output_weights`` key.
        body: the request body, read with ``read(n)`` until it returns ``b""``.
        content_length: the body's declared length in bytes (``Content-Length``).
        sha256: the hex SHA-256 the agent computed over the file.

    Returns:
        ``(sha256, size)`` of the stored file.

    Raises:
        ApplicationError: 404 (not one of the device's assignments), 409 (its round is no
            longer running), 411 (no ``Content-Length``), 413 (larger than
            ``MTFL_MAX_ARTIFACT_BYTES``), 400 (bad or mismatching SHA-256, a body shorter than
            declared, not a safetensors file, tensors unlike the model's) — each with a
            message saying why.
    """
    assignment = _open_assignment(device, key)
    expected_sha = (sha256 or "").strip().lower()
    if not _SHA256_RE.fullmatch(expected_sha):
        raise ApplicationError(
            "send the file's hex SHA-256 in the X-Content-SHA256 header (64 hex digits)", field="sha256"
        )
    limit = int(mtfl_setting("MAX_ARTIFACT_BYTES"))
    if content_length is None:
        raise ApplicationError("a Content-Length header is required", field="body", status_code=411)
    if content_length > limit:
        raise _too_large(content_length, limit)
    reference = _model_tensors(assignment)

    store = get_store()
    with atomic_write_path(store.path(key)) as tmp:
        digest, size = _receive(body, tmp, limit)
        if size != content_length:
            raise ApplicationError(f"the body ended after {size} of the {content_length} bytes declared", field="body")
        if digest != expected_sha:
            raise ApplicationError(
                f"sha256 mismatch: the body's SHA-256 is {digest}, the request declared {expected_sha}",
                field="sha256",
            )
        try:
            tensors = read_safetensors_header(tmp)
        except InvalidSafetensorsError as exc:
            raise ApplicationError(f"not a valid safetensors file: {exc}", field="body") from None
        problem = tensors_mismatch(reference, tensors)
        if problem:
            raise ApplicationError(f"the weights do not fit task {assignment.task_id}'s model: {problem}", field="body")
        # The round may have closed while the body streamed in: then nobody will read it.
        if not Round.objects.filter(id=assignment.round_id, status=Round.Status.RUNNING).exists():
            raise ApplicationError(
                f"round {assignment.round.index} of run {assignment.round.run_id} closed during the upload",
                field="key",
                status_code=409,
            )
    return digest, size


def _too_large(size: int, limit: int) -> ApplicationError:
    return ApplicationError(
        f"the weights file is {size} bytes; the control plane takes at most {limit} (MTFL_MAX_ARTIFACT_BYTES)",
        field="body",
        status_code=413,
    )


def _receive(body: BinaryIO, path: Path, limit: int) -> tuple[str, int]:
    """Copy ``body`` to ``path`` in chunks; return its hex SHA-256 and size.

    Raises:
        ApplicationError: 413 as soon as more than ``limit`` bytes arrived.
    """
    digest = hashlib.sha256()
    size = 0
    with open(path, "wb") as out:
        while True:
            chunk = body.read(CHUNK_BYTES)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest(), size


def _model_tensors(assignment: Assignment) -> dict[str, TensorInfo]:
    """The tensors of the task's initial model in this run (every round's weights have the
    same names, dtypes and shapes).

    Raises:
        ApplicationError: 409 when the run has no readable initial model of the task.
    """
    initial = Checkpoint.objects.filter(
        run_id=assignment.round.run_id, task_id=assignment.task_id, round__isnull=True
    ).first()
    try:
        if initial is None:
            raise FileNotFoundError("no initial checkpoint")
        return read_safetensors_header(get_store().path(initial.artifact_path))
    except (OSError, InvalidSafetensorsError) as exc:
        raise ApplicationError(
            f"run {assignment.round.run_id} has no readable initial model of task {assignment.task_id} to check "
            f"the weights against: {exc}",
            field="key",
            status_code=409,
        ) from None
