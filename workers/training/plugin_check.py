"""The plug-in check: does a task's model and data set work together, before the task exists?

Issue 21 item 4: a task naming a model and a data set (plug-ins or built-ins) is refused when
it is created if the data set cannot be loaded, its arrays break the contract of
:mod:`workers.registry.datasets`, or the model cannot be built or gives outputs of the wrong
shape for the classes. :func:`check_task` runs the check in the calling process;
:func:`check_task_in_child` runs it in a ``python -m workers.training.plugin_check`` child process with
a time limit, so a plug-in that raises, hangs or crashes (a segfault, ``os._exit``) cannot take
the calling process (the web app) with it: that process never imports the plug-in or calls it,
it only reads the child's answer. Either way a refusal is a :class:`PluginCheckError` naming the
task field to fix (``architecture``, ``dataset``, ``dataset_root``, ``num_classes``) and why.

What passes gives the task's sizes (:class:`TaskCheck`): its ``input_shape`` and
``num_classes`` follow from the arrays, and the training and test labels are kept for
partitioning (label-skewed rules) and label histograms.

Child protocol: ``python -m workers.training.plugin_check FOLDER`` reads its arguments as one JSON
object on stdin (``architecture``, ``dataset``, ``dataset_root``, ``num_classes``), writes
``FOLDER/labels.npz`` (``train``, ``test``) and then ``FOLDER/result.json`` (written last, by
rename: its presence means the answer is whole), and prints each stage it enters to stderr as
``mtfl-check-stage <field> <what>``, so the parent can say which stage a timeout or a crash hit.
The child sees no GPU (``CUDA_VISIBLE_DEVICES=""``) and runs torch on one thread.

Imports neither torch nor the plug-ins at module level. It sits in :mod:`workers.training`, above
the registries it reads and beside the zoo and the data set loading it calls, so nothing below it
imports it back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workers.config import positive_seconds
from workers.protocol.messages import DatasetRef
from workers.registry.base import Registry, UnknownEntryError, builtin_source
from workers.registry.dataset_sources import DatasetNotFoundError, digits_labels
from workers.registry.datasets import ARRAY_NAMES, DATASET_REGISTRY, Dataset, SampleArray, root_fingerprint
from workers.registry.models import MODEL_REGISTRY
from workers.registry.splits import MissingArraysError
from workers.training.datasets import load_splits
from workers.training.zoo import build_model

FIELDS: tuple[str, ...] = ("architecture", "dataset", "dataset_root", "num_classes")
"""The task fields a refusal can name."""

MAX_CLASSES = 100_000
"""The most classes a task may have (``TaskRef.num_classes``)."""

MAX_SAMPLE_DIMS = 4
"""A sample has 1 to this many dimensions (``InputShapeField``)."""

MAX_DIM = 65_536
"""The largest size of one sample dimension (``InputShapeField``)."""

TIMEOUT_ENV = "MTFL_PLUGIN_CHECK_TIMEOUT_S"
"""Environment variable with :func:`check_task_in_child`'s default time limit, in seconds."""

DEFAULT_TIMEOUT_S = 120.0
"""The time limit when neither the argument nor :data:`TIMEOUT_ENV` gives one, in seconds."""

STAGE_PREFIX = "mtfl-check-stage "
"""How the child marks a stage line on stderr: ``mtfl-check-stage <field> <what>``."""

_FORWARD_BATCH = 2
"""Samples in the check's forward pass: the smallest batch BatchNorm can train on."""

_CACHE_SIZE = 64
_STDERR_TAIL = 800


@dataclass(frozen=True)
class TaskCheck:
    """What a task's data set and model turned out to be.

    Attributes:
        input_shape: the shape of one sample, ``x_train.shape[1:]`` (1 to 4 dimensions).
        num_classes: the task's classes: the stated number, else the larger of the data set's
            declared classes and ``max label + 1`` over both splits; ``>= 2``.
        train_size: samples in the training split (``>= 2``).
        test_size: samples in the test split (``>= 1``).
        train_labels: int64 ``(train_size,)``, the training split's labels in order.
        test_labels: int64 ``(test_size,)``.
    """

    input_shape: tuple[int, ...]
    num_classes: int
    train_size: int
    test_size: int
    train_labels: np.ndarray
    test_labels: np.ndarray


class PluginCheckError(ValueError):
    """A task's model or data set failed the check.

    The message is ``"<field>: <reason>"``.

    Attributes:
        field: the task field to fix, one of :data:`FIELDS`.
        reason: why, in one line (the plug-in's own error text included).
    """

    def __init__(self, field: str, reason: str) -> None:
        if field not in FIELDS:
            raise ValueError(f"field must be one of {', '.join(FIELDS)}, got {field!r}")
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


StageCallback = Callable[[str, str], None]
"""``(field, what)``: called as the check enters each stage (the field a failure there names,
and what it does, e.g. ``("dataset", "loading 'npz'")``)."""


# ------------------------------------------------------------------------------ in-process


def check_task(
    architecture: str,
    dataset: str,
    dataset_root: str | None,
    num_classes: int | None = None,
    *,
    on_stage: StageCallback | None = None,
) -> TaskCheck:
    """Load the data set, check its arrays, build the model and run it on two samples, here.

    Stages, and the field a failure in each names:

    1. the names: ``dataset`` / ``architecture`` unknown, or their plug-in failed to import
       (the import's error is quoted); ``num_classes`` not an integer in ``[2, 100000]``.
    2. the root: ``dataset_root`` given but not existing, or missing for a data set that needs
       one.
    3. loading: a :class:`~workers.registry.dataset_sources.DatasetNotFoundError` names
       ``dataset_root``; anything else the loader raises names ``dataset``.
    4. the arrays (``dataset``): all four present; ``x`` float32 (no other dtype is converted:
       the model trains on what the data set gives) with shape ``(N, *input_shape)``, 1 to 4
       sample dimensions, the same sample shape in both splits; ``y`` 1-d integers, as many as
       ``x`` has samples, none negative; at least 2 training and 1 test samples; at least 2
       classes (``max label + 1``); a data set's declared classes or input shape agree with its
       arrays. A stated ``num_classes`` below ``max label + 1`` names ``num_classes``.
    5. the model (``architecture``): :func:`workers.training.zoo.build_model` (seed 0) raises,
       or returns no ``torch.nn.Module``; its forward pass on the first two training samples,
       in training mode on CPU, raises or gives anything but float logits of shape
       ``(2, num_classes)``.

    Args:
        architecture: a model name (:data:`~workers.registry.models.MODEL_REGISTRY`).
        dataset: a data set name (:data:`~workers.registry.datasets.DATASET_REGISTRY`).
        dataset_root: the data set's file or folder, or ``None``.
        num_classes: the task's stated classes, or ``None`` to take them from the labels.
        on_stage: called as each stage starts (:data:`StageCallback`).

    Returns:
        The :class:`TaskCheck`.

    Raises:
        PluginCheckError: the first failure, naming its field.
    """
    stage = on_stage or (lambda field, what: None)

    stage("dataset", "importing the mtfl.datasets plug-ins")
    dataset_record: Dataset = _registered(DATASET_REGISTRY, dataset, "dataset")
    stage("architecture", "importing the mtfl.models plug-ins")
    _registered(MODEL_REGISTRY, architecture, "architecture")
    _check_num_classes(num_classes)
    _check_root(dataset_record, dataset_root)

    stage("dataset", f"loading {dataset!r}")
    arrays = _load_arrays(dataset, dataset_root)

    stage("dataset", f"checking the arrays of {dataset!r}")
    input_shape, train_labels, test_labels = _check_arrays(dataset, arrays)
    classes = _check_classes(dataset_record, input_shape, train_labels, test_labels, num_classes)

    stage("architecture", f"building {architecture!r}")
    model = _build(architecture, classes, input_shape)

    stage("architecture", f"running {architecture!r} forward on {_FORWARD_BATCH} samples")
    _forward(architecture, model, dataset, arrays["x_train"], input_shape, classes)

    return TaskCheck(
        input_shape=input_shape,
        num_classes=classes,
        train_size=len(train_labels),
        test_size=len(test_labels),
        train_labels=train_labels,
        test_labels=test_labels,
    )


def _registered(registry: Registry[Any], name: str, field: str) -> Any:
    try:
        return registry.get(name, field=field)
    except UnknownEntryError as exc:
        failure = registry.failure(name)
        if failure is not None:
            raise PluginCheckError(
                field, f"the plug-in {name!r} ({failure.value}) failed to load: {failure.error}"
            ) from None
        raise PluginCheckError(field, exc.reason) from None


def _check_num_classes(num_classes: int | None) -> None:
    """A stated ``num_classes`` is an integer in ``[2, MAX_CLASSES]`` (``None``: from the labels)."""
    if num_classes is not None and (
        isinstance(num_classes, bool) or not isinstance(num_classes, int) or not 2 <= num_classes <= MAX_CLASSES
    ):
        raise PluginCheckError("num_classes", f"must be an integer in [2, {MAX_CLASSES}], got {num_classes!r}")


def _check_root(record: Dataset, root: str | None) -> None:
    if root:
        path = Path(root).expanduser()
        if not path.exists():
            raise PluginCheckError("dataset_root", f"{path} does not exist")
    elif record.needs_root:
        raise PluginCheckError(
            "dataset_root",
            f"is required for {record.name}: the local file or folder it is read from (nothing is downloaded)",
        )


def _load_arrays(dataset: str, root: str | None) -> dict[str, Any]:
    try:
        splits = load_splits(DatasetRef(name=dataset, root=root))
        arrays: dict[str, Any] = {name: getattr(splits, name) for name in ARRAY_NAMES}
    except MissingArraysError as exc:  # a mapping or an object without all four arrays
        raise PluginCheckError("dataset", str(exc)) from None
    except DatasetNotFoundError as exc:
        raise PluginCheckError("dataset_root", str(exc)) from None
    except Exception as exc:  # a plug-in's loader may raise anything: it is reported, not fatal
        raise PluginCheckError("dataset", f"loading {dataset!r} raised {_describe(exc)}") from None
    return arrays


def _check_arrays(dataset: str, arrays: dict[str, Any]) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """The sample shape and both splits' labels (int64 copies), after the contract's checks."""
    shapes: dict[str, tuple[int, ...]] = {}
    labels: dict[str, np.ndarray] = {}
    for split in ("train", "test"):
        x_name, y_name = f"x_{split}", f"y_{split}"
        x = arrays[x_name]
        if not isinstance(x, SampleArray):
            raise PluginCheckError(
                "dataset",
                f"{x_name} of {dataset!r} is a {type(x).__name__}, not an array (shape, dtype, len, x[indices])",
            )
        if np.dtype(x.dtype) != np.float32:
            raise PluginCheckError(
                "dataset", f"{x_name} of {dataset!r} is {np.dtype(x.dtype)}; x must be float32 (.astype(np.float32))"
            )
        shape = tuple(int(d) for d in x.shape)
        if not 2 <= len(shape) <= MAX_SAMPLE_DIMS + 1:
            raise PluginCheckError(
                "dataset",
                f"{x_name} of {dataset!r} has shape {shape}; x must be (N, *input_shape) with 1 to "
                f"{MAX_SAMPLE_DIMS} sample dimensions",
            )
        if not all(1 <= d <= MAX_DIM for d in shape[1:]):
            raise PluginCheckError(
                "dataset", f"{x_name} of {dataset!r} has shape {shape}; sample dimensions must lie in [1, {MAX_DIM}]"
            )
        if len(x) != shape[0]:
            raise PluginCheckError("dataset", f"{x_name} of {dataset!r} has len {len(x)} but shape {shape}")
        try:
            y = np.asarray(arrays[y_name])
        except Exception as exc:
            raise PluginCheckError("dataset", f"{y_name} of {dataset!r} is not an array: {_describe(exc)}") from None
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise PluginCheckError(
                "dataset",
                f"{y_name} of {dataset!r} is {y.dtype} of shape {y.shape}; y must be 1-d integer class labels",
            )
        if len(y) != shape[0]:
            raise PluginCheckError(
                "dataset",
                f"the {split} split of {dataset!r} disagrees in length: {x_name} has {shape[0]} samples, "
                f"{y_name} {len(y)} labels",
            )
        if len(y) and int(y.min()) < 0:
            raise PluginCheckError(
                "dataset", f"{y_name} of {dataset!r} has label {int(y.min())}; labels must lie in [0, num_classes)"
            )
        shapes[split] = shape[1:]
        labels[split] = y.astype(np.int64, copy=True)
    if shapes["train"] != shapes["test"]:
        raise PluginCheckError(
            "dataset",
            f"the splits of {dataset!r} disagree in sample shape: x_train {shapes['train']}, x_test {shapes['test']}",
        )
    if len(labels["train"]) < _FORWARD_BATCH:
        raise PluginCheckError(
            "dataset",
            f"the training split of {dataset!r} has {len(labels['train'])} samples; at least "
            f"{_FORWARD_BATCH} are needed (one batch of two)",
        )
    if not len(labels["test"]):
        raise PluginCheckError("dataset", f"the test split of {dataset!r} is empty; at least 1 sample is needed")
    return shapes["train"], labels["train"], labels["test"]


def _check_classes(
    record: Dataset,
    input_shape: tuple[int, ...],
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    stated: int | None,
) -> int:
    """The task's classes (see :class:`TaskCheck`), after checking them against the labels."""
    name = record.name
    top = int(max(train_labels.max(), test_labels.max()))
    needed = top + 1
    if needed < 2:
        raise PluginCheckError("dataset", f"every label of {name!r} is 0; a classification task needs 2 classes")
    if needed > MAX_CLASSES:
        raise PluginCheckError(
            "dataset", f"the labels of {name!r} reach {top}; at most {MAX_CLASSES} classes are allowed"
        )
    if record.num_classes is not None and needed > record.num_classes:
        raise PluginCheckError(
            "dataset",
            f"the labels of {name!r} reach {top}, outside the [0, {record.num_classes}) its record declares",
        )
    if record.input_shape is not None and tuple(record.input_shape) != input_shape:
        raise PluginCheckError(
            "dataset", f"the samples of {name!r} have shape {input_shape}, not the {record.input_shape} it declares"
        )
    if stated is not None:
        if stated < needed:
            raise PluginCheckError(
                "num_classes",
                f"{stated} is too few for {name!r}: its labels reach {top}, so it has {needed} classes "
                f"(allowed {needed} to {MAX_CLASSES})",
            )
        return stated
    return max(needed, record.num_classes or 0)


def _build(architecture: str, num_classes: int, input_shape: tuple[int, ...]) -> Any:
    import torch  # deferred: torch stays out of the web process, which imports this module

    try:
        model = build_model(architecture, num_classes, 0, input_shape)
    except Exception as exc:  # a plug-in's builder may raise anything
        raise PluginCheckError(
            "architecture",
            f"building {architecture!r} for {num_classes} classes and input shape {input_shape} raised {_describe(exc)}",
        ) from None
    if not isinstance(model, torch.nn.Module):
        raise PluginCheckError(
            "architecture", f"{architecture!r} returned {type(model).__name__}, not a torch.nn.Module"
        )
    return model


def _forward(
    architecture: str,
    model: Any,
    dataset: str,
    x_train: SampleArray,
    input_shape: tuple[int, ...],
    num_classes: int,
) -> None:
    import torch  # deferred: torch stays out of the web process, which imports this module

    positions = np.arange(_FORWARD_BATCH, dtype=np.int64)
    try:
        batch = np.array(x_train[positions], dtype=np.float32)
    except Exception as exc:
        raise PluginCheckError("dataset", f"x_train[[0, 1]] of {dataset!r} raised {_describe(exc)}") from None
    if batch.shape != (_FORWARD_BATCH, *input_shape):
        raise PluginCheckError(
            "dataset",
            f"x_train[[0, 1]] of {dataset!r} gave shape {batch.shape}, not {(_FORWARD_BATCH, *input_shape)}",
        )
    model.train()
    try:
        with torch.no_grad():
            out = model(torch.from_numpy(batch))
    except Exception as exc:
        raise PluginCheckError(
            "architecture",
            f"{architecture!r} on a batch of {_FORWARD_BATCH} samples of shape {input_shape} raised {_describe(exc)}",
        ) from None
    expected = (_FORWARD_BATCH, num_classes)
    if not isinstance(out, torch.Tensor):
        raise PluginCheckError(
            "architecture", f"{architecture!r} returned {type(out).__name__}, not a tensor of shape {expected}"
        )
    if tuple(out.shape) != expected or not out.is_floating_point():
        raise PluginCheckError(
            "architecture",
            f"{architecture!r} gives output of shape {tuple(out.shape)} ({out.dtype}) for {_FORWARD_BATCH} samples "
            f"of shape {input_shape}; expected float logits of shape {expected} (num_classes={num_classes})",
        )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# ------------------------------------------------------------------------------ in a child

_results: OrderedDict[tuple[Any, ...], TaskCheck | tuple[str, str]] = OrderedDict()
_results_lock = threading.Lock()


def clear_check_cache() -> None:
    """Forget :func:`check_task_in_child`'s answers (after installing or upgrading a plug-in)."""
    with _results_lock:
        _results.clear()


def default_timeout_s() -> float:
    """:data:`TIMEOUT_ENV` in seconds, else :data:`DEFAULT_TIMEOUT_S`.

    Raises:
        ValueError: the variable is set but not a positive number.
    """
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    value = positive_seconds(raw)
    if value is None:
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, got {raw!r}")
    return value


def check_task_in_child(
    architecture: str,
    dataset: str,
    dataset_root: str | None,
    num_classes: int | None = None,
    timeout_s: float | None = None,
) -> TaskCheck:
    """:func:`check_task` in a ``python -m workers.training.plugin_check`` child, within ``timeout_s``.

    This process imports no plug-in and calls none: the child does. A task with no plug-in in
    it (the built-in ``digits`` and a built-in architecture) is answered here instead
    (:func:`_builtin_digits_check`): the child's few seconds of importing torch would buy
    nothing. Answers (a
    :class:`TaskCheck` or a refusal the child reported) are kept per arguments and the root's
    modification times (:func:`~workers.registry.datasets.root_fingerprint`) for the life of the
    process; a timeout or a crash is not
    kept (it may be the host's load, not the plug-in).

    Args:
        architecture, dataset, dataset_root, num_classes: as :func:`check_task`.
        timeout_s: the child's time limit in seconds (``> 0``); ``None``: :func:`default_timeout_s`.

    Returns:
        The :class:`TaskCheck`.

    Raises:
        PluginCheckError: the check refused the task; the child did not finish within the limit
            (``"<what> did not finish within N s"``, naming the field of the stage it was in);
            the child ended without an answer (a crash: its exit status or signal and the tail
            of its stderr).
        ValueError: ``timeout_s`` not positive, or :data:`TIMEOUT_ENV` malformed.
    """
    timeout = default_timeout_s() if timeout_s is None else float(timeout_s)
    if not timeout > 0 or timeout == float("inf"):
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    key = (architecture, dataset, dataset_root, num_classes, root_fingerprint(dataset_root))
    with _results_lock:
        cached = _results.get(key)
    if cached is not None:
        if isinstance(cached, TaskCheck):
            return cached
        raise PluginCheckError(*cached)
    try:
        builtin = _builtin_digits_check(architecture, dataset, dataset_root, num_classes)
    except PluginCheckError as error:
        _remember(key, (error.field, error.reason))
        raise
    if builtin is not None:
        _remember(key, builtin)
        return builtin
    try:
        result = _run_child(architecture, dataset, dataset_root, num_classes, timeout)
        answer: TaskCheck | tuple[str, str] = result
    except _ChildRefusal as refusal:
        answer = (refusal.error.field, refusal.error.reason)
        _remember(key, answer)
        raise refusal.error from None
    _remember(key, answer)
    return result


DIGITS_INPUT_SHAPE = (3, 32, 32)
"""The sample shape of the built-in ``digits`` (:func:`workers.registry.dataset_sources.digits_splits`)."""


def _builtin_digits_check(
    architecture: str, dataset: str, dataset_root: str | None, num_classes: int | None
) -> TaskCheck | None:
    """The check of a task that involves no plug-in, answered here: mtfl-lab's own ``digits``
    with one of its own torchvision architectures (their builders take any 3-channel image of
    32 pixels and more, and are tested with the digits); ``None`` for any other task.

    No child process is needed (nothing a researcher installed runs), and no model is built:
    the labels come from scikit-learn's copy of the digits
    (:func:`workers.registry.dataset_sources.digits_labels`), so the web app imports no torch.

    Raises:
        PluginCheckError: as :func:`check_task` (a ``num_classes`` below 10 or out of range,
            a ``dataset_root`` given that does not exist).
    """
    if dataset != "digits" or dataset not in DATASET_REGISTRY or architecture not in MODEL_REGISTRY:
        return None
    if DATASET_REGISTRY.source(dataset) != builtin_source() or MODEL_REGISTRY.source(architecture) != builtin_source():
        return None
    _check_num_classes(num_classes)
    record: Dataset = DATASET_REGISTRY.get(dataset)
    _check_root(record, dataset_root)
    train_labels, test_labels = digits_labels()
    classes = _check_classes(record, DIGITS_INPUT_SHAPE, train_labels, test_labels, num_classes)
    return TaskCheck(
        input_shape=DIGITS_INPUT_SHAPE,
        num_classes=classes,
        train_size=len(train_labels),
        test_size=len(test_labels),
        train_labels=train_labels,
        test_labels=test_labels,
    )


def _remember(key: tuple[Any, ...], answer: TaskCheck | tuple[str, str]) -> None:
    with _results_lock:
        _results[key] = answer
        while len(_results) > _CACHE_SIZE:
            _results.popitem(last=False)


class _ChildRefusal(Exception):
    """The child answered with a refusal (kept in the cache, unlike a timeout or a crash)."""

    def __init__(self, error: PluginCheckError) -> None:
        super().__init__(str(error))
        self.error = error


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    # The check never needs a GPU, and a plug-in initialising CUDA in the web host's child
    # would take GPU memory from the trainers.
    env["CUDA_VISIBLE_DEVICES"] = ""
    env["OMP_NUM_THREADS"] = "1"
    env["MKL_NUM_THREADS"] = "1"
    # The child sees the modules this process sees, including folders put on sys.path at run
    # time (a plug-in installed into a running process).
    paths = [p or os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _run_child(
    architecture: str, dataset: str, dataset_root: str | None, num_classes: int | None, timeout: float
) -> TaskCheck:
    args = {"architecture": architecture, "dataset": dataset, "dataset_root": dataset_root, "num_classes": num_classes}
    with tempfile.TemporaryDirectory(prefix="mtfl-check-") as tmp:
        folder = Path(tmp)
        stderr_path = folder / "stderr.txt"
        with open(stderr_path, "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "workers.training.plugin_check", str(folder)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=_child_env(),
                cwd=os.getcwd(),
                start_new_session=True,  # its own process group: a timeout kills what it started too
            )
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps(args).encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it died at once: reported below from its status
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                field, what = _last_stage(stderr_path)
                raise PluginCheckError(field, f"{what} did not finish within {timeout:g} s") from None
        result_path = folder / "result.json"
        if not result_path.is_file():
            field, what = _last_stage(stderr_path)
            status = f"was killed by {_signal_name(-rc)}" if rc < 0 else f"exited with status {rc}"
            tail = _stderr_tail(stderr_path)
            raise PluginCheckError(
                field, f"{what}: the check process {status} without an answer" + (f"; stderr: {tail}" if tail else "")
            )
        result = json.loads(result_path.read_text())
        if not result["ok"]:
            raise _ChildRefusal(PluginCheckError(result["field"], result["reason"]))
        with np.load(folder / "labels.npz", allow_pickle=False) as labels:
            train_labels, test_labels = labels["train"], labels["test"]
    return TaskCheck(
        input_shape=tuple(result["input_shape"]),
        num_classes=int(result["num_classes"]),
        train_size=int(result["train_size"]),
        test_size=int(result["test_size"]),
        train_labels=train_labels.astype(np.int64, copy=False),
        test_labels=test_labels.astype(np.int64, copy=False),
    )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _last_stage(stderr_path: Path) -> tuple[str, str]:
    """The field and description of the last stage the child printed."""
    field, what = "dataset", "starting the check process"
    for line in stderr_path.read_text(errors="replace").splitlines():
        if line.startswith(STAGE_PREFIX):
            parts = line[len(STAGE_PREFIX) :].split(" ", 1)
            if len(parts) == 2 and parts[0] in FIELDS:
                field, what = parts[0], parts[1]
    return field, what


def _stderr_tail(stderr_path: Path) -> str:
    lines = [
        line.strip()
        for line in stderr_path.read_text(errors="replace").splitlines()
        if line.strip() and not line.startswith(STAGE_PREFIX)
    ]
    return " | ".join(lines)[-_STDERR_TAIL:]


def _child_main(argv: Sequence[str]) -> int:
    """The child: read the arguments from stdin, run :func:`check_task`, write the answer."""
    if len(argv) != 1:
        print("usage: python -m workers.training.plugin_check FOLDER  (arguments as JSON on stdin)", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    current = ["dataset", "starting the check process"]

    def on_stage(field: str, what: str) -> None:
        current[:] = [field, what]
        print(f"{STAGE_PREFIX}{field} {what}", file=sys.stderr, flush=True)
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "set_num_threads"):
            # One thread (OMP_NUM_THREADS=1 sets torch's default too): the check shares the web
            # host. torch is imported only by the stages that need it, so a plug-in that hangs
            # while loading is caught by its stage, not by torch's import time.
            torch.set_num_threads(1)

    on_stage(*current)
    args = json.loads(sys.stdin.read())
    try:
        check = check_task(
            args["architecture"], args["dataset"], args["dataset_root"], args["num_classes"], on_stage=on_stage
        )
        np.savez(folder / "labels.npz", train=check.train_labels, test=check.test_labels)
        result: dict[str, Any] = {
            "ok": True,
            "input_shape": list(check.input_shape),
            "num_classes": check.num_classes,
            "train_size": check.train_size,
            "test_size": check.test_size,
        }
    except PluginCheckError as exc:
        result = {"ok": False, "field": exc.field, "reason": exc.reason}
    except Exception as exc:  # a failure check_task did not classify: the stage's field
        result = {"ok": False, "field": current[0], "reason": f"{current[1]} raised {_describe(exc)}"}
    partial = folder / "result.json.partial"
    partial.write_text(json.dumps(result))
    partial.rename(folder / "result.json")
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
