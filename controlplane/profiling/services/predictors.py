"""Fitting predictors from profile samples, and loading them for the planner."""

from __future__ import annotations

import hashlib
import logging
import pickle
from collections.abc import Callable, Sequence

from django.conf import settings
from django.db import transaction
from django.db.models import Max

from controlplane.celery import app
from controlplane.common.errors import ApplicationError
from controlplane.common.registered import registered
from controlplane.fleet.models import Device
from controlplane.fleet.selectors import device_class as class_of
from controlplane.fleet.selectors import device_cores
from controlplane.planning.predictor import (
    FAMILIES,
    MixTask,
    ModelWorkload,
    PredictorError,
    ProfiledTask,
    ThroughputPredictor,
    fit_predictor,
    placement_for_backend,
)
from controlplane.profiling.models import Predictor, ProfileSample, ProfileSweep
from controlplane.profiling.services.workloads import INPUT_SHAPE, workload_ensure
from workers.fl.artifacts import atomic_write_path, sha256_file
from workers.protocol.queues import CONTROL_QUEUE, TaskName
from workers.registry.backends import BACKEND_REGISTRY

log = logging.getLogger(__name__)

REFERENCE_NUM_CLASSES = 10
"""Profiles run the zoo's models with 10 classes at 3×32×32 unless a sweep asks for another shape
(``ProfileSweepRequest.workloads``); their workloads are taken at that size (the classifier is
a negligible part of the work)."""


def _device_classes(backend: str) -> list[str]:
    return sorted(set(ProfileSample.objects.filter(backend=backend).values_list("device_class", flat=True)))


def _resolve_class(backend: str, device_class: str | None) -> str:
    registered(BACKEND_REGISTRY, backend, field="backend")
    classes = _device_classes(backend)
    if not classes:
        raise ApplicationError(
            f"no profile samples for backend {backend!r} yet: profile a device first (POST /api/devices/{{id}}/profile/ "
            "or `mtfl profile --device NAME --budget 600`)",
            field="backend",
            status_code=409,
        )
    if device_class is None:
        if len(classes) > 1:
            raise ApplicationError(
                f"several device classes have samples; choose one of {', '.join(classes)}", field="device_class"
            )
        return classes[0]
    if device_class not in classes:
        raise ApplicationError(
            f"device_class {device_class!r} has no samples; allowed: {', '.join(classes)}", field="device_class"
        )
    return device_class


@transaction.atomic
def predictor_request(*, backend: str = "cpu", device_class: str | None = None) -> Predictor:
    """Create a predictor (status ``fitting``) and have the control worker fit it.

    Open to every user, not only lab staff, although planners take the newest ready version
    (:func:`predictor_current`): a fit reads nothing but the shared samples of ``backend`` and
    ``device_class`` and is seeded, so its model is the one anyone's fit of those samples gives.

    Raises:
        ApplicationError: unknown backend, no samples, or an ambiguous / unknown device class.
    """
    predictor = _new_version(backend, _resolve_class(backend, device_class))
    transaction.on_commit(lambda: app.send_task(TaskName.PREDICTOR_FIT, args=[predictor.id], queue=CONTROL_QUEUE))
    return predictor


def _new_version(backend: str, device_class: str) -> Predictor:
    latest = Predictor.objects.filter(backend=backend, device_class=device_class).aggregate(v=Max("version"))["v"] or 0
    return Predictor.objects.create(backend=backend, device_class=device_class, version=latest + 1)


def training_samples(backend: str, device_class: str) -> list[ProfiledTask]:
    """The class's profile samples of ONE execution mode: the newest sample's (issue 31).

    Eager and CUDA-graph throughputs of one configuration differ by the factor graphs exist
    for, and a graph step's host time is one replay, not one launch per operation: fitted
    together, the predictor and its host launch term (``host_seconds_per_op``) would describe
    neither mode. The newest mode is what the device's rounds run now; samples that recorded no
    mode (profiled before modes existed, all eager) count as eager.
    """
    samples = ProfileSample.objects.filter(backend=backend, device_class=device_class)
    newest = samples.exclude(execution_mode="").order_by("-id").values_list("execution_mode", flat=True).first()
    if newest == "graphs":
        samples = samples.filter(execution_mode="graphs")
    elif newest == "eager":
        samples = samples.filter(execution_mode__in=("eager", ""))
    out = []
    for s in samples.order_by("id").iterator():
        mix = tuple(
            MixTask(t["architecture"], int(t["batch_size"]), int(t["active_thread_percentage"]))
            for t in s.configuration
        )
        out.append(
            ProfiledTask(
                s.config_key,
                mix,
                s.task_index,
                s.throughput_sps,
                s.standalone_sps,
                s.peak_memory_bytes,
                s.speed_index,
                s.cross_core_rtt_ns,
                s.host_step_s,
                s.gpu_busy_fraction,
            )
        )
    return out


def profiled_shapes(backend: str, architectures: set[str]) -> dict[str, tuple[int, list[int]]]:
    """The ``(num_classes, input_shape)`` each architecture was profiled at on ``backend``.

    In order: the newest sweep of the backend whose request named a shape for it
    (``ProfileSweepRequest.workloads``, what ``sweep_start(tasks=...)`` sends for a task whose
    shape is not the zoo's); else, when FL rounds measured it, the newest such task's shape if
    its input is not 3×32×32 (a plug-in model on other data cannot be built at the zoo's);
    else :data:`REFERENCE_NUM_CLASSES` at 3×32×32, as every zoo model has always been taken.
    """
    shapes: dict[str, tuple[int, list[int]]] = {}
    for request in ProfileSweep.objects.filter(backend=backend).order_by("-id").values_list("request", flat=True):
        for arch, shape in ((request or {}).get("workloads") or {}).items():
            if arch in architectures and arch not in shapes:
                shapes[arch] = (int(shape["num_classes"]), [int(d) for d in shape["input_shape"]])
    rest = architectures - set(shapes)
    if rest:
        # The tasks are read through the samples' assignments (newest task first), not from the
        # experiments app's models: profiling sits below it and imports none of its modules.
        tasks = (
            ProfileSample.objects.filter(
                backend=backend, source=ProfileSample.Source.RUN, architecture__in=rest, assignment__isnull=False
            )
            .values_list(
                "assignment__task_id",
                "assignment__task__architecture",
                "assignment__task__num_classes",
                "assignment__task__input_shape",
            )
            .order_by("-assignment__task_id")
            .distinct()
        )
        for _task_id, arch, num_classes, input_shape in tasks:
            if arch not in shapes and input_shape and list(input_shape) != INPUT_SHAPE:
                shapes[arch] = (int(num_classes), [int(d) for d in input_shape])
    for arch in architectures - set(shapes):
        shapes[arch] = (REFERENCE_NUM_CLASSES, list(INPUT_SHAPE))
    return shapes


def _workloads(backend: str, architectures: set[str]) -> dict[str, ModelWorkload]:
    out = {}
    shapes = profiled_shapes(backend, architectures)
    for arch in sorted(architectures):
        num_classes, input_shape = shapes[arch]
        w = workload_ensure(architecture=arch, num_classes=num_classes, input_shape=input_shape)
        out[arch] = ModelWorkload(
            w.train_flops_per_sample, w.activation_bytes_per_sample, w.params, w.param_bytes, w.ops_per_step
        )
    return out


def predictor_fit(
    *,
    predictor_id: int | None = None,
    backend: str = "cpu",
    device_class: str | None = None,
    families: Sequence[str] = FAMILIES,
    progress: Callable[[str], None] | None = None,
) -> Predictor:
    """Fit a predictor on every profile sample of its backend and device class.

    With ``predictor_id`` it fits that (``fitting``) row; otherwise it creates the next version.
    The fitted model is pickled into the artifact store (read back only by
    :func:`predictor_load`, which checks its sha256). A fit that cannot be done leaves the row
    ``failed`` with the reason.

    Raises:
        ApplicationError: (without ``predictor_id``) as :func:`predictor_request`.
    """
    if predictor_id is None:
        predictor = _new_version(backend, _resolve_class(backend, device_class))
    else:
        predictor = Predictor.objects.get(id=predictor_id)
    samples = training_samples(predictor.backend, predictor.device_class)
    devices = [d for d in Device.objects.filter(backend=predictor.backend) if class_of(d) == predictor.device_class]
    cores = device_cores(devices[0]) if devices else 1
    try:
        workloads = _workloads(predictor.backend, {t.architecture for s in samples for t in s.mix})
        model, report = fit_predictor(
            samples,
            workloads,
            cores=cores,
            placement=placement_for_backend(predictor.backend),
            families=families,
            progress=progress,
        )
    except (PredictorError, ValueError) as exc:
        Predictor.objects.filter(id=predictor.id).update(status=Predictor.Status.FAILED, error=str(exc))
        predictor.refresh_from_db()
        return predictor
    key = f"predictors/{predictor.backend}/{predictor.device_class}/v{predictor.version}.pkl"
    path = settings.ARTIFACT_ROOT / key
    with atomic_write_path(path) as tmp:
        tmp.write_bytes(pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL))
    kept = next(f for f in report.families if f.family == report.kept)
    Predictor.objects.filter(id=predictor.id).update(
        status=Predictor.Status.READY,
        feature_spec=model.space.spec(),
        training_samples=report.samples,
        training_configurations=report.configurations,
        kept_family=report.kept,
        heldout_rmsle=kept.rmsle,
        heldout_mape=kept.mape,
        fit_seconds=report.fit_seconds,
        heldout=report.heldout,
        metrics={
            f.family: {
                "rmsle": f.rmsle,
                "mape": f.mape,
                "fit_seconds": f.fit_seconds,
                "by_mix_size": {str(k): v for k, v in f.by_mix_size.items()},
                "by_slice": f.by_slice,
            }
            for f in report.families
        },
        artifact_path=key,
        sha256=sha256_file(path),
    )
    predictor.refresh_from_db()
    return predictor


def predictor_load(predictor: Predictor) -> ThroughputPredictor:
    """Load a ready predictor's model from the artifact store.

    Only files this service wrote are ever unpickled, and only after their sha256 matches the
    one recorded when they were written.

    Raises:
        ApplicationError: the predictor is not ready, or its artifact is missing or altered.
    """
    if predictor.status != Predictor.Status.READY:
        raise ApplicationError(
            f"predictor {predictor.id} is {predictor.status}, not ready", field="predictor", status_code=409
        )
    path = settings.ARTIFACT_ROOT / predictor.artifact_path
    if not path.is_file():
        raise ApplicationError(
            f"predictor {predictor.id}'s artifact {path} is missing", field="predictor", status_code=409
        )
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != predictor.sha256:
        raise ApplicationError(
            f"predictor {predictor.id}'s artifact does not match its sha256; refusing to load it",
            field="predictor",
            status_code=409,
        )
    return pickle.loads(data)  # noqa: S301 - our own artifact, integrity checked above


def predictor_current(*, backend: str, device_class: str) -> Predictor | None:
    """The newest ready predictor of a backend and device class."""
    return (
        Predictor.objects.filter(backend=backend, device_class=device_class, status=Predictor.Status.READY)
        .order_by("-version")
        .first()
    )
