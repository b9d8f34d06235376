"""The artifact store: model weights (safetensors files) addressed by key.

Keys are relative POSIX paths (``runs/3/tasks/7/global/round-00002.safetensors``); the key
helpers below are the only place their layout is decided. :class:`ArtifactStore` is the
swappable interface, :class:`LocalArtifactStore` the implementation over a local (or shared,
e.g. NFS) folder, :func:`get_store` the factory. Writes are atomic (temporary file in the same
folder, then ``os.replace``), so a reader never sees a half-written file.

Weights that cross a trust boundary (an agent's upload to the control plane, a download on the
agent) are checked by :func:`read_safetensors_header` before anything reads them as tensors: the
safetensors library parses the header and checks it against the file size without loading data
and without pickle.

The torch helpers (:func:`save_model_weights`, :func:`load_model_weights`) import torch inside
the function; importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open

from workers import config
from workers.protocol.queues import DEVICE_NAME_RE

if TYPE_CHECKING:
    import torch

_CHUNK_BYTES = 1 << 20


def sha256_file(path: Path | str) -> str:
    """Return the hex SHA-256 digest of a file's bytes.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_write_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success move it onto ``path`` atomically.

    The parent folder is created if missing. If the body raises, the temporary file is removed
    and ``path`` is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid artifact key, else raise.

    A key is a non-empty relative POSIX path without ``.``/``..`` components, NUL bytes or
    backslashes.

    Raises:
        ValueError: naming the key and the rule it breaks.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"artifact key must be a non-empty string, got {key!r}")
    if "\x00" in key or "\\" in key:
        raise ValueError(f"artifact key {key!r} must not contain NUL bytes or backslashes")
    if key.startswith("/"):
        raise ValueError(f"artifact key {key!r} must be relative, not absolute")
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"artifact key {key!r} must not contain empty, '.' or '..' path components")
    return str(PurePosixPath(key))


class ArtifactStore(ABC):
    """Where weights live, addressed by key (see :func:`validate_key`)."""

    @abstractmethod
    def path(self, key: str) -> Path:
        """Return a local path for ``key`` (the file may not exist yet).

        Raises:
            ValueError: if ``key`` is invalid.
        """

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Return whether an artifact is stored under ``key``."""

    @abstractmethod
    def write_bytes(self, key: str, data: bytes) -> str:
        """Store ``data`` under ``key`` atomically and return its hex SHA-256."""

    @abstractmethod
    def put_file(self, key: str, source: Path | str) -> str:
        """Copy the file ``source`` under ``key`` atomically and return its hex SHA-256.

        Raises:
            FileNotFoundError: if ``source`` does not exist.
        """

    @abstractmethod
    def sha256(self, key: str) -> str:
        """Return the hex SHA-256 of the artifact under ``key``.

        Raises:
            FileNotFoundError: naming the key and path, if nothing is stored there.
        """


class LocalArtifactStore(ArtifactStore):
    """An artifact store over a local folder: key ``a/b.safetensors`` is ``root/a/b.safetensors``.

    Args:
        root: the store's folder; created if missing.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"LocalArtifactStore({str(self.root)!r})"

    def path(self, key: str) -> Path:
        """Return ``root / key``.

        Raises:
            ValueError: if ``key`` is invalid (:func:`validate_key`).
        """
        return self.root / validate_key(key)

    def exists(self, key: str) -> bool:
        """Return whether ``root / key`` is an existing file."""
        return self.path(key).is_file()

    def write_bytes(self, key: str, data: bytes) -> str:
        """Write ``data`` to ``root / key`` atomically; return its hex SHA-256."""
        target = self.path(key)
        with atomic_write_path(target) as tmp:
            tmp.write_bytes(data)
        return hashlib.sha256(data).hexdigest()

    def put_file(self, key: str, source: Path | str) -> str:
        """Copy ``source`` to ``root / key`` atomically; return its hex SHA-256.

        Raises:
            FileNotFoundError: if ``source`` does not exist.
        """
        source = Path(source)
        if not source.is_file():
            raise FileNotFoundError(f"cannot store {source}: no such file")
        with atomic_write_path(self.path(key)) as tmp:
            shutil.copyfile(source, tmp)
            digest = sha256_file(tmp)
        return digest

    def sha256(self, key: str) -> str:
        """Return the hex SHA-256 of ``root / key``.

        Raises:
            FileNotFoundError: naming the key and path, if the file does not exist.
        """
        target = self.path(key)
        if not target.is_file():
            raise FileNotFoundError(f"artifact {key!r} not found at {target}")
        return sha256_file(target)


def get_store(root: Path | str | None = None) -> ArtifactStore:
    """Return the artifact store at ``root`` (default :func:`workers.config.artifact_root`)."""
    return LocalArtifactStore(config.artifact_root() if root is None else root)


def global_weights_key(run_id: int, task_id: int, round_index: int | None) -> str:
    """Return the key of a task's global model: initial (``round_index=None``) or after a round.

    Raises:
        ValueError: if an id or ``round_index`` is negative.
    """
    _require_non_negative(run_id=run_id, task_id=task_id)
    if round_index is None:
        return f"runs/{run_id}/tasks/{task_id}/global/initial.safetensors"
    _require_non_negative(round_index=round_index)
    return f"runs/{run_id}/tasks/{task_id}/global/round-{round_index:05d}.safetensors"


def server_state_key(run_id: int, task_id: int, round_index: int) -> str:
    """Return the key of a task's aggregator server state after a round (momentum, ``m``,
    ``v`` of a server optimiser, Reddi et al. 2021), beside that round's global model.

    Agents never read it: :func:`parse_global_weights_key` does not accept it, so the agent
    download endpoint does not serve it.

    Raises:
        ValueError: if an id or ``round_index`` is negative.
    """
    _require_non_negative(run_id=run_id, task_id=task_id, round_index=round_index)
    return f"runs/{run_id}/tasks/{task_id}/global/server-state-round-{round_index:05d}.safetensors"


def device_weights_key(run_id: int, round_index: int, device: str, task_id: int) -> str:
    """Return the key of the weights a device trained for a task in a round.

    Raises:
        ValueError: if an id or ``round_index`` is negative, or ``device`` is not a valid device
            name (:data:`workers.protocol.queues.DEVICE_NAME_RE`).
    """
    _require_non_negative(run_id=run_id, round_index=round_index, task_id=task_id)
    if not DEVICE_NAME_RE.match(device):
        raise ValueError(f"device name {device!r} is invalid (see workers.protocol.queues.DEVICE_NAME_RE)")
    return f"runs/{run_id}/rounds/{round_index:05d}/{device}/task-{task_id}.safetensors"


_GLOBAL_KEY_RE = re.compile(r"runs/(\d+)/tasks/(\d+)/global/(?:initial|round-(\d+))\.safetensors")
_DEVICE_KEY_RE = re.compile(r"runs/(\d+)/rounds/(\d+)/([^/]+)/task-(\d+)\.safetensors")


def parse_global_weights_key(key: str) -> tuple[int, int, int | None] | None:
    """Return ``(run_id, task_id, round_index)`` of a key :func:`global_weights_key` made, else
    ``None`` (``round_index`` is ``None`` for the initial model). Only the exact spelling
    :func:`global_weights_key` produces is accepted (no leading zeros, no extra components)."""
    match = _GLOBAL_KEY_RE.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        return None
    run_id, task_id = int(match[1]), int(match[2])
    round_index = None if match[3] is None else int(match[3])
    return (run_id, task_id, round_index) if global_weights_key(run_id, task_id, round_index) == key else None


def parse_device_weights_key(key: str) -> tuple[int, int, str, int] | None:
    """Return ``(run_id, round_index, device, task_id)`` of a key :func:`device_weights_key`
    made, else ``None``. Only its exact spelling is accepted."""
    match = _DEVICE_KEY_RE.fullmatch(key) if isinstance(key, str) else None
    if match is None or not DEVICE_NAME_RE.match(match[3]):
        return None
    parsed = (int(match[1]), int(match[2]), match[3], int(match[4]))
    return parsed if device_weights_key(*parsed) == key else None


def _require_non_negative(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def save_model_weights(model: torch.nn.Module, path: Path | str) -> str:
    """Write ``model.state_dict()`` (parameters and buffers) as safetensors, atomically.

    Tensors are detached, moved to CPU and copied into contiguous memory (safetensors refuses
    non-contiguous or storage-sharing tensors).

    Args:
        model: any ``torch.nn.Module``.
        path: destination file; parent folders are created.

    Returns:
        The hex SHA-256 of the written file.
    """
    # deferred: safetensors.torch imports torch; importing this module does not
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().to("cpu").clone().contiguous() for name, tensor in model.state_dict().items()}
    with atomic_write_path(path) as tmp:
        save_file(tensors, str(tmp))
        digest = sha256_file(tmp)
    return digest


def load_model_weights(model: torch.nn.Module, path: Path | str) -> None:
    """Load a safetensors state dict into ``model`` with ``strict=True``.

    Raises:
        FileNotFoundError: naming ``path`` if it does not exist.
        RuntimeError: from ``load_state_dict`` if keys or shapes do not match the model.
    """
    # deferred: safetensors.torch imports torch; importing this module does not
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    model.load_state_dict(load_file(str(path), device="cpu"), strict=True)


# ----------------------------------------------------------------------- safetensors checks

MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
"""The largest JSON header accepted (the limit the safetensors library itself applies)."""

_LIBRARY_PREFIX = "Error while deserializing header: "


class InvalidSafetensorsError(ValueError):
    """A file is not a well-formed safetensors file; the message says why in one line."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header declares it: dtype name (``"F32"``, ``"BF16"``, ...)
    and shape."""

    dtype: str
    shape: tuple[int, ...]


def read_safetensors_header(path: Path | str) -> dict[str, TensorInfo]:
    """Check that ``path`` is a well-formed safetensors file and return its tensors.

    The safetensors library parses and checks the header (``safe_open``, which memory-maps the
    file and reads the 8-byte length and the JSON header only, never tensor data, never
    pickle): the length is at most 100 MiB and within the file, the JSON is an object whose
    entries have a known dtype, a shape of non-negative integers and ``data_offsets`` whose
    span is that shape's byte size, the spans tile the data section exactly (no gap, overlap,
    truncation or trailing bytes), and ``__metadata__`` maps strings to strings. Entry fields
    other than those three are ignored, as every safetensors reader ignores them.

    The 8-byte length is also read here first, only so the most common wrong files get a
    message saying what they are: an empty or truncated upload ("shorter than the 8-byte header
    length", "runs past the end ... (truncated?)") and a file of another format, whose first
    bytes read as an absurd length ("not a safetensors file (a pickle, zip or HTML page?)");
    the library reports all of them as a bare "header too large" or "invalid header length".

    Args:
        path: the file.

    Returns:
        ``{name: TensorInfo}`` for every tensor (``__metadata__`` left out).

    Raises:
        InvalidSafetensorsError: one line naming the problem (the library's reason otherwise).
        FileNotFoundError: if ``path`` does not exist.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
    if len(prefix) < 8:
        raise InvalidSafetensorsError(f"file is {size} bytes, shorter than the 8-byte header length (truncated?)")
    header_len = int.from_bytes(prefix, "little")
    if not 2 <= header_len <= MAX_SAFETENSORS_HEADER_BYTES:
        raise InvalidSafetensorsError(
            f"header length {header_len} is out of range (2 to {MAX_SAFETENSORS_HEADER_BYTES} bytes): "
            "not a safetensors file (a pickle, zip or HTML page?)"
        )
    if 8 + header_len > size:
        raise InvalidSafetensorsError(
            f"header length {header_len} runs past the end of the {size}-byte file (truncated?)"
        )
    try:
        with safe_open(str(path), framework="numpy") as handle:
            tensors: dict[str, TensorInfo] = {}
            for name in handle.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                view = handle.get_slice(name)
                tensors[name] = TensorInfo(view.get_dtype(), tuple(view.get_shape()))
    except SafetensorError as exc:
        raise InvalidSafetensorsError(_library_reason(exc)) from None
    return tensors


def _library_reason(exc: Exception) -> str:
    """The safetensors library's message in one line, with the likely cause where its words
    alone do not say it (a file cut short reads as "not fully covered")."""
    reason = " ".join(str(exc).split()).removeprefix(_LIBRARY_PREFIX)
    if "not fully covered" in reason:
        reason += " (truncated or trailing bytes)"
    return reason


def tensors_mismatch(expected: dict[str, TensorInfo], actual: dict[str, TensorInfo]) -> str | None:
    """Say how ``actual`` differs from ``expected`` (names, dtypes, shapes), or ``None``.

    Returns:
        One line naming the first missing or unexpected tensor, or one whose dtype or shape
        differs; ``None`` when they match.
    """
    missing = sorted(set(expected) - set(actual))
    if missing:
        return f"tensor {missing[0]!r} is missing ({len(missing)} missing in all)"
    extra = sorted(set(actual) - set(expected))
    if extra:
        return f"tensor {extra[0]!r} is not in the model ({len(extra)} unexpected in all)"
    for name in sorted(expected):
        if expected[name] != actual[name]:
            want, got = expected[name], actual[name]
            return f"tensor {name!r} is {got.dtype} {list(got.shape)}, the model has {want.dtype} {list(want.shape)}"
    return None
