"""The artifact store: model weights (safetensors files) addressed by key.

Keys are relative POSIX paths (``runs/3/tasks/7/global/round-00002.safetensors``); the key
helpers below are the only place their layout is decided. :class:`ArtifactStore` is the
swappable interface, :class:`LocalArtifactStore` the implementation over a local (or shared,
e.g. NFS) folder, :func:`get_store` the factory. Writes are atomic (temporary file in the same
folder, then ``os.replace``), so a reader never sees a half-written file.

Weights that cross a trust boundary (an agent's upload to the control plane, a download on the
agent) are checked by :func:`read_safetensors_header` before anything reads them as tensors: the
header is parsed and checked against the file size without loading data and without pickle.

The torch helpers (:func:`save_model_weights`, :func:`load_model_weights`) import torch inside
the function; importing this module does not import torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from workers import config
from workers.queues import DEVICE_NAME_RE

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
        raise ValueError(
            f"artifact key {key!r} must not contain empty, '.' or '..' path components"
        )
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


def device_weights_key(run_id: int, round_index: int, device: str, task_id: int) -> str:
    """Return the key of the weights a device trained for a task in a round.

    Raises:
        ValueError: if an id or ``round_index`` is negative, or ``device`` is not a valid device
            name (:data:`workers.queues.DEVICE_NAME_RE`).
    """
    _require_non_negative(run_id=run_id, round_index=round_index, task_id=task_id)
    if not DEVICE_NAME_RE.match(device):
        raise ValueError(f"device name {device!r} is invalid (see workers.queues.DEVICE_NAME_RE)")
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
    from safetensors.torch import save_file

    tensors = {
        name: tensor.detach().to("cpu").clone().contiguous()
        for name, tensor in model.state_dict().items()
    }
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
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    model.load_state_dict(load_file(str(path), device="cpu"), strict=True)


# ----------------------------------------------------------------------- safetensors checks

SAFETENSORS_DTYPE_BYTES: dict[str, int] = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}
"""Bytes per element of each safetensors dtype accepted (the whole-byte ones)."""

MAX_SAFETENSORS_HEADER_BYTES = 100 * 1024 * 1024
"""The largest JSON header accepted (the limit the safetensors library itself applies)."""


class InvalidSafetensorsError(ValueError):
    """A file is not a well-formed safetensors file; the message says why in one line."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header declares it: dtype name and shape."""

    dtype: str
    shape: tuple[int, ...]


def read_safetensors_header(path: Path | str) -> dict[str, TensorInfo]:
    """Check that ``path`` is a well-formed safetensors file and return its tensors.

    Reads only the header (never tensor data, never pickle). The format (huggingface
    safetensors): an 8-byte little-endian unsigned header length ``N``; ``N`` bytes of UTF-8
    JSON, an object mapping tensor names to ``{"dtype", "shape", "data_offsets": [begin,
    end]}`` plus an optional ``"__metadata__"`` object of strings; then the data section.
    Checked: ``N`` in ``[2, 100 MiB]`` and within the file, the header parses as a JSON object,
    every dtype is known, shapes are lists of non-negative integers, each tensor's byte span is
    ``prod(shape) * itemsize``, and the spans tile the data section exactly (no gap, overlap or
    trailing bytes). Finally the safetensors library opens the file (header only) as well.

    Args:
        path: the file.

    Returns:
        ``{name: TensorInfo}`` for every tensor (``__metadata__`` left out).

    Raises:
        InvalidSafetensorsError: naming the first problem found.
        FileNotFoundError: if ``path`` does not exist.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise InvalidSafetensorsError(
                f"file is {size} bytes, shorter than the 8-byte header length (truncated?)")
        header_len = int.from_bytes(prefix, "little")
        if not 2 <= header_len <= MAX_SAFETENSORS_HEADER_BYTES:
            raise InvalidSafetensorsError(
                f"header length {header_len} is out of range (2 to {MAX_SAFETENSORS_HEADER_BYTES} "
                "bytes): not a safetensors file (a pickle or zip file renamed?)")
        if 8 + header_len > size:
            raise InvalidSafetensorsError(
                f"header length {header_len} runs past the end of the {size}-byte file (truncated?)")
        raw = handle.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidSafetensorsError("header is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise InvalidSafetensorsError(f"header is not JSON: {exc.msg} at byte {exc.pos}") from None
    if not isinstance(header, dict):
        raise InvalidSafetensorsError(f"header is JSON {type(header).__name__}, not an object")

    data_size = size - 8 - header_len
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise InvalidSafetensorsError("__metadata__ must be an object of strings")
            continue
        tensors[name] = info = _tensor_info(name, entry)
        begin, end = entry["data_offsets"]
        count = math.prod(info.shape)
        if end - begin != count * SAFETENSORS_DTYPE_BYTES[info.dtype]:
            raise InvalidSafetensorsError(
                f"tensor {name!r}: data_offsets span {end - begin} bytes but {info.dtype} "
                f"{list(info.shape)} needs {count * SAFETENSORS_DTYPE_BYTES[info.dtype]}")
        spans.append((begin, end, name))
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            what = "overlaps the previous tensor" if begin < position else f"leaves a gap at byte {position}"
            raise InvalidSafetensorsError(f"tensor {name!r}: data_offsets [{begin}, {end}] {what}")
        position = end
    if position != data_size:
        raise InvalidSafetensorsError(
            f"the tensors' data ends at byte {position} of the data section but the file holds "
            f"{data_size} bytes there (truncated or trailing bytes)")
    _open_with_safetensors(path)
    return tensors


def _tensor_info(name: str, entry: object) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise InvalidSafetensorsError(
            f"tensor {name!r}: entry must be an object with exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in SAFETENSORS_DTYPE_BYTES:
        raise InvalidSafetensorsError(
            f"tensor {name!r}: dtype {dtype!r} is not supported; allowed: "
            f"{', '.join(SAFETENSORS_DTYPE_BYTES)}")

    def is_count(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if not isinstance(shape, list) or not all(is_count(d) for d in shape):
        raise InvalidSafetensorsError(f"tensor {name!r}: shape {shape!r} is not a list of integers >= 0")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(is_count(o) for o in offsets)
            or offsets[0] > offsets[1]):
        raise InvalidSafetensorsError(
            f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end")
    return TensorInfo(dtype, tuple(shape))


def _open_with_safetensors(path: Path) -> None:
    """Let the safetensors library parse the header too (it maps the file, reads no tensor)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            handle.keys()
    except Exception as exc:  # noqa: BLE001 - the library's own error types vary by version
        raise InvalidSafetensorsError(f"the safetensors library refused it: {exc}") from None


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
            return (f"tensor {name!r} is {got.dtype} {list(got.shape)}, the model has "
                    f"{want.dtype} {list(want.shape)}")
    return None
