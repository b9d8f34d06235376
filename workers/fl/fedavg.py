"""Federated averaging of full state dicts with NumPy (no torch), so the control plane can
aggregate without importing torch.

FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized
Data", AISTATS 2017; docs/DESIGN.md §1): a task's global model is the sample-weighted mean of the
models the devices trained, ``W ← Σ_j n_j W_j / Σ_j n_j``, with ``n_j`` the samples device
``j`` holds for the task. It is applied to every tensor of the state dict, buffers included
(BatchNorm running statistics are averaged like weights).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from workers.fl.artifacts import InvalidSafetensorsError, atomic_write_path, read_safetensors_header, sha256_file

_CHUNK = 1 << 20  # elements per float64 work buffer (8 MiB)


class NoSamplesError(ValueError):
    """Every device reported 0 samples for a task, so there is nothing to average.

    The caller keeps the previous global model and flags the round.
    """


def fedavg(states: Sequence[Mapping[str, np.ndarray]], sample_counts: Sequence[int]) -> dict[str, np.ndarray]:
    """Average device state dicts weighted by sample count (FedAvg).

    For every key, ``W ← Σ_j n_j W_j / Σ_j n_j`` accumulated in float64 and cast back to the
    tensor's dtype. Floating tensors keep their dtype. Integer tensors (e.g. BatchNorm's
    ``num_batches_tracked``, int64 with shape ``()``) get the weighted mean rounded to the
    nearest integer (halves to even, ``np.rint``), so they stay integers instead of being
    averaged as floats. Devices with ``n_j = 0`` get weight 0 and their tensors are not read
    into the sum (a NaN there cannot leak into the result), but they must still match the
    others' keys, shapes and dtypes. The result does not depend on the order of the devices
    beyond float64 rounding.

    Args:
        states: one state dict per device, name → array; all with the same keys, and per key
            the same shape and dtype.
        sample_counts: ``n_j`` per device, integers ``>= 0``; same length as ``states``.

    Returns:
        A new state dict with the same keys, shapes and dtypes.

    Raises:
        ValueError: if ``states`` is empty, lengths differ, a count is negative or not an
            integer, keys/shapes/dtypes differ across devices (naming the key), or a tensor has
            an unsupported dtype (bool, complex, object).
        NoSamplesError: if every count is 0.
    """
    if len(states) == 0:
        raise ValueError("fedavg needs at least one state dict, got none")
    if len(states) != len(sample_counts):
        raise ValueError(f"fedavg got {len(states)} state dicts but {len(sample_counts)} sample_counts")
    counts = []
    for j, count in enumerate(sample_counts):
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"sample_counts[{j}] must be an integer >= 0, got {count!r}")
        counts.append(int(count))
    _check_compatible(states)
    total = sum(counts)
    if total == 0:
        raise NoSamplesError(
            f"all {len(states)} devices report 0 samples: nothing to average (keep the previous global model)"
        )
    accumulator = FedAvgAccumulator()
    for state, n in zip(states, counts, strict=True):
        accumulator.add(state, n)
    return accumulator.result()


class FedAvgAccumulator:
    """FedAvg as a weighted running sum: add one device's state dict at a time, then take the
    average, so aggregating ``J`` devices holds one model and a float64 sum in memory instead
    of ``J`` models.

    ``add(W_j, n_j)`` for every device, then :meth:`result` gives ``Σ_j n_j W_j / Σ_j n_j``,
    computed exactly as :func:`fedavg` does (float64, fixed-size chunks, devices summed in the
    order added, integer tensors rounded half to even): the same states in the same order give
    bit-identical results either way.

    Raises:
        ValueError: from :meth:`add`, a count that is not an integer ``>= 0``, or a state whose
            keys, shapes or dtypes differ from the first one's (naming the key, with its index
            among the states added), or an unsupported dtype (bool, complex, object).
    """

    def __init__(self) -> None:
        self._reference: dict[str, tuple[tuple[int, ...], np.dtype]] | None = None
        self._sums: dict[str, np.ndarray] = {}
        self._total = 0
        self._added = 0
        self._done = False
        self._term = np.empty(_CHUNK, dtype=np.float64)

    @property
    def total(self) -> int:
        """``Σ_j n_j`` so far."""
        return self._total

    def add(self, state: Mapping[str, np.ndarray], count: int) -> None:
        """Add ``count · state`` to the sum (a device with ``count = 0`` is checked, not read).

        Raises:
            ValueError: see the class.
        """
        if self._done:
            raise RuntimeError("this FedAvgAccumulator has given its result; start a new one")
        j = self._added
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
            raise ValueError(f"sample_counts[{j}] must be an integer >= 0, got {count!r}")
        if self._reference is None:
            _check_compatible([state])
            self._reference = {key: (np.asarray(v).shape, np.asarray(v).dtype) for key, v in state.items()}
            self._sums = {
                key: np.zeros(int(np.prod(shape)), dtype=np.float64) for key, (shape, _) in self._reference.items()
            }
        else:
            self._check(state, j, self._reference)
        self._added += 1
        n = int(count)
        if n == 0:
            return
        self._total += n
        for key, acc in self._sums.items():
            flat = np.asarray(state[key]).reshape(-1)
            for start in range(0, flat.size, _CHUNK):
                stop = min(start + _CHUNK, flat.size)
                tmp = self._term[: stop - start]
                np.multiply(flat[start:stop], n, out=tmp, dtype=np.float64)
                acc[start:stop] += tmp

    @staticmethod
    def _check(state: Mapping[str, np.ndarray], j: int, reference: dict[str, tuple[tuple[int, ...], np.dtype]]) -> None:
        if set(state) != set(reference):
            missing = sorted(set(reference) - set(state))
            extra = sorted(set(state) - set(reference))
            raise ValueError(
                f"state dict {j} has different keys than state dict 0: missing {missing[:5]}, extra {extra[:5]}"
            )
        for key, (shape, dtype) in reference.items():
            b = np.asarray(state[key])
            if b.shape != shape:
                raise ValueError(f"state key {key!r} has shape {b.shape} in state dict {j} but {shape} in state dict 0")
            if b.dtype != dtype:
                raise ValueError(f"state key {key!r} has dtype {b.dtype} in state dict {j} but {dtype} in state dict 0")

    @property
    def dtypes(self) -> dict[str, np.dtype]:
        """Each key's dtype, as the first state added has it (``{}`` before the first :meth:`add`)."""
        return {key: dtype for key, (_, dtype) in (self._reference or {}).items()}

    def means(self) -> dict[str, np.ndarray]:
        """The sample-weighted means of the states added in float64, not cast back: what a
        server optimiser forms its pseudo-gradient from (:mod:`workers.fl.server_opt`).

        Same keys and shapes as the states added, every array float64 (integer tensors not
        rounded). Like :meth:`result`, it spends the accumulator: call one of the two, once.

        Raises:
            ValueError: nothing was added.
            NoSamplesError: every count was 0.
            RuntimeError: called after :meth:`result` or :meth:`means`.
        """
        if self._done:
            raise RuntimeError("this FedAvgAccumulator has already given its result")
        if self._reference is None:
            raise ValueError("fedavg needs at least one state dict, got none")
        if self._total == 0:
            raise NoSamplesError(
                f"all {self._added} devices report 0 samples: nothing to average (keep the previous global model)"
            )
        means: dict[str, np.ndarray] = {}
        for key, (shape, _) in self._reference.items():
            acc = self._sums[key]
            # In place, chunk by chunk: the sum's buffer becomes the mean, no second float64 copy.
            for start in range(0, acc.size, _CHUNK):
                stop = min(start + _CHUNK, acc.size)
                acc[start:stop] /= self._total
            means[key] = acc.reshape(shape)
        self._sums = {}  # the sums are spent (they became the means): a second call would be wrong
        self._done = True
        return means

    def result(self) -> dict[str, np.ndarray]:
        """The sample-weighted mean of the states added, same keys, shapes and dtypes.

        Raises:
            ValueError: nothing was added.
            NoSamplesError: every count was 0.
            RuntimeError: called a second time.
        """
        dtypes = self.dtypes
        averaged = self.means()
        for key, mean in averaged.items():
            averaged[key] = cast_mean(mean, dtypes[key])
        return averaged


def cast_mean(mean: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A float64 mean cast back to a tensor's ``dtype``: integer tensors (BatchNorm's
    ``num_batches_tracked``) rounded to the nearest integer first, halves to even (``np.rint``),
    as FedAvg does. ``mean`` may be rounded in place."""
    if np.issubdtype(dtype, np.integer):
        np.rint(mean, out=mean)
    return mean.astype(dtype)


def _check_compatible(states: Sequence[Mapping[str, np.ndarray]]) -> None:
    reference = states[0]
    keys = set(reference)
    for key, value in reference.items():
        dtype = np.asarray(value).dtype
        if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
            raise ValueError(f"state key {key!r} has dtype {dtype}; fedavg supports floating and integer tensors only")
    for j, state in enumerate(states[1:], start=1):
        other_keys = set(state)
        if other_keys != keys:
            missing = sorted(keys - other_keys)
            extra = sorted(other_keys - keys)
            raise ValueError(
                f"state dict {j} has different keys than state dict 0: missing {missing[:5]}, extra {extra[:5]}"
            )
        for key, value in reference.items():
            a, b = np.asarray(value), np.asarray(state[key])
            if a.shape != b.shape:
                raise ValueError(
                    f"state key {key!r} has shape {b.shape} in state dict {j} but {a.shape} in state dict 0"
                )
            if a.dtype != b.dtype:
                raise ValueError(
                    f"state key {key!r} has dtype {b.dtype} in state dict {j} but {a.dtype} in state dict 0"
                )


def load_state(path: Path | str) -> dict[str, np.ndarray]:
    """Read a safetensors file into a NumPy state dict (no torch, no pickle).

    The header is checked first (:func:`workers.fl.artifacts.read_safetensors_header`), so a
    truncated file or one that is not safetensors is refused with the reason instead of the
    library's bare error.

    Raises:
        FileNotFoundError: naming ``path`` if it does not exist.
        workers.fl.artifacts.InvalidSafetensorsError: naming ``path`` and what is wrong with it.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    try:
        read_safetensors_header(path)
        return load_file(str(path))
    except InvalidSafetensorsError as exc:
        raise InvalidSafetensorsError(f"weights file {path} is not a valid safetensors file: {exc}") from None
    except SafetensorError as exc:
        raise InvalidSafetensorsError(f"weights file {path} cannot be read as safetensors: {exc}") from None


def save_state(state: Mapping[str, np.ndarray], path: Path | str) -> str:
    """Write a NumPy state dict as safetensors, atomically; return the file's hex SHA-256.

    Non-contiguous arrays are copied into C-contiguous memory first, as safetensors requires;
    0-d arrays stay 0-d (``np.ascontiguousarray`` would make them 1-d and break a strict load).
    """
    arrays = {key: np.require(value, requirements="C") for key, value in state.items()}
    with atomic_write_path(path) as tmp:
        save_file(arrays, str(tmp))
        digest = sha256_file(tmp)
    return digest
