"""API views: validate the request's shape, call a service, serialize the result."""

from __future__ import annotations

import django_filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api import serializers as s
from controlplane.api.authentication import CanIssueAgentTokens
from controlplane.api.filters import FilterSet
from controlplane.experiments import selectors as exp_selectors
from controlplane.experiments import services as exp_services
from controlplane.experiments.models import Assignment, Checkpoint, Experiment, Round, Run, Task
from controlplane.experiments.services import sweeps as exp_sweeps
from controlplane.experiments.services.planner_check import planner_check
from controlplane.experiments.services.templates import TEMPLATES, template_dataset_default
from controlplane.fleet import selectors as fleet_selectors
from controlplane.fleet import services as fleet_services
from controlplane.fleet.models import Device
from controlplane.lab import selectors as lab_selectors
from controlplane.profiling import selectors as profiling_selectors
from controlplane.profiling import services as profiling_services
from controlplane.profiling.models import ModelWorkload, Predictor, ProfileSample
from controlplane.storage.services import retention


def validated_data(serializer_class, request: Request, **kwargs) -> dict:
    """The request body checked by ``serializer_class`` (``kwargs`` go to it, e.g.
    ``partial=True``).

    Raises:
        rest_framework.exceptions.ValidationError: the body is invalid (the API answers 400,
            naming each field).
    """
    serializer = serializer_class(data=request.data, **kwargs)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


class DeviceFilter(FilterSet):
    status = django_filters.ChoiceFilter(
        choices=Device.Status.choices,
        method="filter_status",
        help_text="online: heartbeat within MTFL_HEARTBEAT_OFFLINE_S; offline: older; unknown: never",
    )

    class Meta:
        model = Device
        fields = ["backend", "status"]

    def filter_status(self, queryset, name, value):
        return fleet_selectors.devices_with_status(queryset, value)


# PATCH takes the same fields as PUT (all optional); without this the schema shows no body.
@extend_schema_view(partial_update=extend_schema(request=s.DeviceUpdateSerializer, responses={200: s.DeviceSerializer}))
class DeviceViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Devices of the federation; each is served by ``mtfl agent --device NAME``."""

    # Pool and pause (the lab's) with the device, as the pause and resume answers give them.
    serializer_class = s.LabDeviceSerializer
    filterset_class = DeviceFilter

    def get_queryset(self):
        return fleet_selectors.device_list().select_related("pool")

    @extend_schema(request=s.DeviceCreateSerializer, responses={201: s.LabDeviceSerializer})
    def create(self, request: Request) -> Response:
        device = fleet_services.device_create(**validated_data(s.DeviceCreateSerializer, request))
        return Response(s.LabDeviceSerializer(device).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.DeviceUpdateSerializer, responses={200: s.LabDeviceSerializer})
    def update(self, request: Request, pk=None, partial=False) -> Response:
        device = fleet_services.device_update(
            device=self.get_object(), **validated_data(s.DeviceUpdateSerializer, request)
        )
        return Response(s.LabDeviceSerializer(device).data)

    @extend_schema(request=s.ProfileSweepCreateSerializer, responses={202: s.ProfileSweepSerializer})
    @action(detail=True, methods=["post"])
    def profile(self, request: Request, pk=None) -> Response:
        """Start a profiling sweep on the device for ``budget_s`` seconds; follow it at
        ``/api/profile-sweeps/{id}/`` (``progress``, ``configs``, ``samples``) and cancel it with
        ``POST /api/profile-sweeps/{id}/cancel/``. A researcher without staff rights may give at
        most :data:`~controlplane.common.limits.SWEEP_BUDGET_SELF_SERVE` (403 above it)."""
        sweep = exp_sweeps.sweep_start(
            device=self.get_object(), actor=request.user, **validated_data(s.ProfileSweepCreateSerializer, request)
        )
        return Response(s.ProfileSweepSerializer(sweep).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={201: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["post"], permission_classes=[CanIssueAgentTokens])
    def token(self, request: Request, pk=None) -> Response:
        """Issue the device's agent token (``Authorization: Agent <key>`` on ``/api/agent/``),
        replacing the previous one, which stops working at once. The key is in this response
        only: the control plane keeps its SHA-256. Needs ``fleet.add_devicetoken`` (superusers
        have it)."""
        token, key = fleet_services.device_token_issue(device=self.get_object(), issued_by=request.user)
        return Response(
            {"device": token.device_id, "device_name": token.device.name, "token": key, "created_at": token.created_at},
            status=status.HTTP_201_CREATED,
        )


@extend_schema_view(partial_update=extend_schema(request=s.TaskWriteSerializer, responses={200: s.TaskSerializer}))
class TaskViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    """Learning tasks: a registered model trained on a registered dataset. Creating or changing
    one checks both in a child process (400 naming the field for a plug-in that fails);
    ``input_shape``, sizes and ``label_counts`` come from the data."""

    serializer_class = s.TaskSerializer
    queryset = Task.objects.order_by("id")
    filterset_fields = ["architecture", "dataset"]

    def get_serializer(self, *args, **kwargs):
        """The serializer of a page of tasks (or one) with their workloads read for the page."""
        if args:
            tasks = list(args[0]) if kwargs.get("many") else [args[0]]
            kwargs["context"] = {**self.get_serializer_context(), **_task_facts(tasks)}
            args = (tasks if kwargs.get("many") else args[0], *args[1:])
        return super().get_serializer(*args, **kwargs)

    @extend_schema(request=s.TaskWriteSerializer, responses={201: s.TaskSerializer})
    def create(self, request: Request) -> Response:
        task = exp_services.task_create(owner=request.user, **validated_data(s.TaskWriteSerializer, request))
        return Response(s.TaskSerializer(task, context=_task_facts([task])).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.TaskWriteSerializer, responses={200: s.TaskSerializer})
    def update(self, request: Request, pk=None, partial=False) -> Response:
        data = validated_data(s.TaskWriteSerializer, request, partial=partial)
        if partial:
            data = {k: v for k, v in data.items() if k in request.data}
        task = exp_services.task_update(task=self.get_object(), actor=request.user, **data)
        return Response(s.TaskSerializer(task, context=_task_facts([task])).data)


@extend_schema_view(
    partial_update=extend_schema(request=s.ExperimentUpdateSerializer, responses={200: s.ExperimentSerializer})
)
class ExperimentViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Experiments: tasks × devices with each device's shard of each task's data."""

    serializer_class = s.ExperimentSerializer

    def get_queryset(self):
        """Only the experiments the user owns or collaborates on: others' are 404, not 403."""
        return exp_selectors.experiment_list(user=self.request.user).prefetch_related("shards__device", "shards__task")

    def get_serializer(self, *args, **kwargs):
        """The serializer of a page of experiments (or one) with what each partition leaves
        without data, read once for the page (:func:`_experiment_facts`)."""
        if args:
            experiments = list(args[0]) if kwargs.get("many") else [args[0]]
            kwargs["context"] = {**self.get_serializer_context(), **_experiment_facts(experiments)}
            args = (experiments if kwargs.get("many") else args[0], *args[1:])
        return super().get_serializer(*args, **kwargs)

    @extend_schema(request=s.ExperimentCreateSerializer, responses={201: s.ExperimentSerializer})
    def create(self, request: Request) -> Response:
        data = validated_data(s.ExperimentCreateSerializer, request)
        experiment = exp_services.experiment_create(
            name=data["name"],
            description=data["description"],
            task_ids=data["tasks"],
            device_ids=data["devices"],
            rounds=data["rounds"],
            local_epochs=data["local_epochs"],
            partition_rule=data["partition_rule"],
            partition_params=data["partition_params"],
            dirichlet_alpha=data["dirichlet_alpha"],
            seed=data["seed"],
            sample_counts=data["sample_counts"],
            owner=request.user,
            device_retries=data["device_retries"],
            deadline_factor=data["deadline_factor"],
            lr_scaling=data["lr_scaling"],
            untrusted_predictor=data["untrusted_predictor"],
            aggregation=data["aggregation"],
            aggregation_params=data["aggregation_params"],
            task_aggregation=data["task_aggregation"],
            clients_per_round=data["clients_per_round"],
            client_fraction=data["client_fraction"],
            client_sampling=data["client_sampling"],
            keep_device_weights=data["keep_device_weights"],
            keep_last_checkpoints=data["keep_last_checkpoints"],
        )
        return Response(
            self.get_serializer(self.get_queryset().get(id=experiment.id)).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=s.ExperimentFromTemplateSerializer, responses={201: s.ExperimentSerializer})
    @action(detail=False, methods=["post"], url_path="from-template")
    def from_template(self, request: Request) -> Response:
        """Create an experiment from a built-in template (``GET /api/experiment-templates/``):
        its three tasks on the given devices, Dirichlet-skewed data volumes per task and device,
        on CIFAR-10 when ``MTFL_CIFAR10_ROOT`` holds it and on the digits otherwise."""
        data = dict(validated_data(s.ExperimentFromTemplateSerializer, request))
        experiment = exp_services.experiment_create_from_template(
            template=data.pop("template"), device_ids=data.pop("devices"), owner=request.user, **data
        )
        return Response(
            self.get_serializer(self.get_queryset().get(id=experiment.id)).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=s.ExperimentUpdateSerializer, responses={200: s.ExperimentSerializer})
    def update(self, request: Request, pk=None, partial=False) -> Response:
        data = validated_data(s.ExperimentUpdateSerializer, request, partial=True)
        experiment = exp_services.experiment_update(experiment=self.get_object(), actor=request.user, **data)
        return Response(self.get_serializer(self.get_queryset().get(id=experiment.id)).data)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, pk=None) -> Response:
        """Delete the experiment (its owner only): its shards, comparisons, runs and everything
        below them, and the runs' artifacts; its tasks stay in the catalogue. 409 while one of
        its runs is pending or running, or a comparison is running: cancel it first."""
        retention.experiment_delete(experiment=self.get_object(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=s.RunCreateSerializer, responses={201: s.RunSerializer})
    @action(detail=True, methods=["post"], url_path="runs")
    def runs(self, request: Request, pk=None) -> Response:
        """Launch a run of a strategy: a baseline (``temporal``, ``isolation``, ``sharing``), a
        planner (``vres_greedy``, ``vres_sync``; ``options`` set it up) or ``manual`` (``plan``).
        In the shared lab its rounds wait (``queued``) for their devices; ``pool`` places them on a
        device pool's free devices, ``priority`` serves them before lower ones."""
        data = validated_data(s.RunCreateSerializer, request)
        run = exp_services.run_create(
            experiment=self.get_object(),
            strategy=data["strategy"],
            plan=data["plan"],
            options=data["options"],
            pool=data["pool"],
            priority=data["priority"],
        )
        return Response(s.RunSerializer(run, context=_run_facts([run])).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: s.PlannerCheckSerializer})
    @action(detail=True, methods=["get"], url_path="planner-check", pagination_class=None, filter_backends=[])
    def planner_check(self, request: Request, pk=None) -> Response:
        """What the planner's guard says of a ``vres_*`` run of this experiment now: the warnings
        a run would carry (an untrusted predictor, a mix it was not fitted on), what the
        experiment's ``untrusted_predictor`` does about them, and the threshold. A device without
        a fitted predictor is answered 200 with its message as a warning and ``predictors_ready``
        false (a run itself is refused with that message, 400)."""
        return Response(s.PlannerCheckSerializer(planner_check(self.get_object())).data)

    @extend_schema(responses={200: s.LabelHistogramSerializer(many=True)})
    @action(detail=True, methods=["get"], url_path="label-histograms", pagination_class=None, filter_backends=[])
    def label_histograms(self, request: Request, pk=None) -> Response:
        """Each device's class histogram of each task (a plain list, by task then device name):
        how the partition rule skewed the labels. ``label_counts`` has ``num_classes`` entries."""
        rows = exp_selectors.label_histograms(self.get_object())
        return Response(s.LabelHistogramSerializer(rows, many=True).data)

    @extend_schema(request=s.ComparisonCreateSerializer, responses={201: s.ComparisonSerializer})
    @action(detail=True, methods=["post"])
    def compare(self, request: Request, pk=None) -> Response:
        """Run strategies one after another on this experiment (default: every compared one,
        ``temporal``, ``isolation``, ``sharing``, ``vres_greedy``, ``vres_sync`` and any plug-in's;
        ``strategies`` picks a subset holding ``temporal``); the experiment page compares them."""
        data = validated_data(s.ComparisonCreateSerializer, request)
        comparison = exp_services.comparison_create(
            experiment=self.get_object(),
            options=data["options"],
            strategies=data["strategies"],
            repeats=data["repeats"],
            targets=data["targets"],
            pool=data["pool"],
            priority=data["priority"],
        )
        return Response(s.ComparisonSerializer(comparison).data, status=status.HTTP_201_CREATED)


class PluginsApi(APIView):
    """Models, datasets and partitioners: what is installed on the control plane (with the
    entry points that failed to load) and what each online device's agent declared. A run is
    refused when a device holding a task's data, or the control plane, lacks its model or
    dataset."""

    # An APIView, not a ViewSet's list: the answer is one object, and drf-spectacular documents
    # a ViewSet's list action as an array.
    @extend_schema(responses={200: s.PluginsSerializer})
    def get(self, request: Request) -> Response:
        data = {
            "installed": fleet_selectors.installed_plugin_rows(),
            "failures": fleet_selectors.plugin_failure_rows(),
            "devices": fleet_selectors.device_plugin_declarations(),
        }
        return Response(s.PluginsSerializer(data).data)


class StorageApi(APIView):
    """The artifact store: its size, its free space against ``MTFL_MIN_FREE_BYTES`` (below it,
    rounds refuse to start) and what each experiment you can see holds. ``mtfl gc`` frees what
    the retention policy allows; ``DELETE`` a run or an experiment to free the rest."""

    @extend_schema(responses={200: s.StorageSerializer})
    def get(self, request: Request) -> Response:
        visible = exp_selectors.experiment_list(user=request.user).select_related(None).prefetch_related(None)
        overview = retention.storage_overview(visible.only("id", "name"))
        return Response(s.StorageSerializer(overview).data)


class ComparisonViewSet(viewsets.ReadOnlyModelViewSet):
    """Comparisons: every strategy run one after another on an experiment. Launch one with
    ``POST /api/experiments/{id}/compare/``."""

    serializer_class = s.ComparisonSerializer

    def get_queryset(self):
        return exp_selectors.comparison_list(user=self.request.user)

    def get_serializer_class(self):
        # One comparison answers with its whole report (a few queries); a list stays light.
        return s.ComparisonDetailSerializer if self.action == "retrieve" else s.ComparisonSerializer

    @extend_schema(request=None, responses={200: s.ComparisonSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk=None) -> Response:
        """Cancel a comparison: the run in flight is cancelled and the others never start."""
        comparison = exp_services.comparison_cancel(comparison=self.get_object())
        return Response(s.ComparisonSerializer(comparison).data)


class ExperimentTemplateViewSet(viewsets.ViewSet):
    """The built-in experiment templates: the three task mixes of Yu et al. 2022, §5. Create an
    experiment from one with ``POST /api/experiments/from-template/``."""

    @extend_schema(responses={200: s.ExperimentTemplateSerializer(many=True)})
    def list(self, request: Request) -> Response:
        dataset = template_dataset_default()
        rows = [
            {
                "name": t.name,
                "title": t.title,
                "description": t.description,
                "architectures": list(t.architectures),
                "dataset": dataset,
            }
            for t in TEMPLATES.values()
        ]
        return Response(s.ExperimentTemplateSerializer(rows, many=True).data)


def _visible_experiments(request):
    return exp_selectors.experiment_list(user=request.user if request else None)


def _visible_runs(request):
    return exp_selectors.run_list(user=request.user if request else None)


def _experiment_facts(experiments: list[Experiment]) -> dict:
    """What :class:`~controlplane.api.serializers.ExperimentSerializer` reads for ``experiments``:
    each one's partition warnings (:func:`~controlplane.experiments.selectors.experiments_data_warnings`)."""
    return {"experiment_warnings": exp_selectors.experiments_data_warnings([e.id for e in experiments])}


def _task_facts(tasks: list[Task]) -> dict:
    """What :class:`~controlplane.api.serializers.TaskSerializer` reads for ``tasks``: each task's
    workload features (:func:`~controlplane.profiling.selectors.task_workloads`)."""
    return {"task_workloads": profiling_selectors.task_workloads(tasks)}


def _run_facts(runs: list[Run]) -> dict:
    """What :class:`~controlplane.api.serializers.RunSerializer` reads for ``runs`` (a page of
    runs, or one): each run's queue entry, the queue replayed at most once, and its speedups,
    one baseline look-up per experiment."""
    return {"run_queues": lab_selectors.runs_queue_entries(runs), "run_speedups": exp_selectors.runs_speedups(runs)}


class RunFilter(FilterSet):
    experiment = django_filters.ModelChoiceFilter(queryset=_visible_experiments)

    class Meta:
        model = Run
        fields = ["experiment", "strategy", "status"]


class RunViewSet(mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet):
    """Runs: one strategy executed on an experiment. Launch one with
    ``POST /api/experiments/{id}/runs/``."""

    serializer_class = s.RunSerializer
    filterset_class = RunFilter

    def get_queryset(self):
        return exp_selectors.run_list(user=self.request.user)

    def get_serializer(self, *args, **kwargs):
        """The serializer of a page of runs (or one) with their queue entries and speedups read
        once for the page (:func:`_run_facts`)."""
        if args:
            runs = list(args[0]) if kwargs.get("many") else [args[0]]
            kwargs["context"] = {**self.get_serializer_context(), **_run_facts(runs)}
            args = (runs if kwargs.get("many") else args[0], *args[1:])
        return super().get_serializer(*args, **kwargs)

    @extend_schema(request=None, responses={204: None})
    def destroy(self, request: Request, pk=None) -> Response:
        """Delete a finished run (its experiment's owner only): its rounds, assignments,
        checkpoints and artifacts. 409 while it is pending or running: cancel it first."""
        retention.run_delete(run=self.get_object(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: s.RunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk=None) -> Response:
        """Cancel a run: no further round starts."""
        run = exp_services.run_cancel(run=self.get_object())
        return Response(s.RunSerializer(run, context=_run_facts([run])).data)

    @extend_schema(responses={200: dict})
    @action(detail=True, methods=["get"])
    def progress(self, request: Request, pk=None) -> Response:
        """Rounds done, the current round's assignments done, and a fraction in [0, 1]."""
        return Response(exp_selectors.run_progress(self.get_object()))


class RoundFilter(FilterSet):
    experiment = django_filters.ModelChoiceFilter(field_name="run__experiment", queryset=_visible_experiments)
    run = django_filters.ModelChoiceFilter(queryset=_visible_runs)

    class Meta:
        model = Round
        fields = ["run", "experiment", "status", "index"]


class RoundViewSet(viewsets.ReadOnlyModelViewSet):
    """Rounds (FL synchronisation cycles) with their time and throughput metrics."""

    serializer_class = s.RoundSerializer
    filterset_class = RoundFilter

    def get_queryset(self):
        return exp_selectors.round_list(user=self.request.user)

    @extend_schema(responses={200: s.DeviceTelemetrySerializer(many=True)})
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])  # one round's rows, a plain list
    def telemetry(self, request: Request, pk=None) -> Response:
        """Whole-GPU utilisation and memory each GPU device's agent sampled (NVML, about once a
        second) during the round; empty for cpu and simulated devices."""
        rows = exp_selectors.round_telemetry(self.get_object())
        return Response(s.DeviceTelemetrySerializer(rows, many=True).data)


class AssignmentFilter(FilterSet):
    run = django_filters.ModelChoiceFilter(field_name="round__run", queryset=_visible_runs)
    experiment = django_filters.ModelChoiceFilter(field_name="round__run__experiment", queryset=_visible_experiments)

    class Meta:
        model = Assignment
        fields = ["round", "run", "experiment", "device", "task", "status"]


class AssignmentViewSet(viewsets.ReadOnlyModelViewSet):
    """Assignments: one task on one device in one round (plan and measurements)."""

    serializer_class = s.AssignmentSerializer
    filterset_class = AssignmentFilter

    def get_queryset(self):
        return exp_selectors.assignment_list(user=self.request.user)


class CheckpointFilter(FilterSet):
    run = django_filters.ModelChoiceFilter(queryset=_visible_runs)

    class Meta:
        model = Checkpoint
        fields = ["run", "task", "round"]


class CheckpointViewSet(viewsets.ReadOnlyModelViewSet):
    """Checkpoints: the global model of each task after each round, with its test accuracy."""

    serializer_class = s.CheckpointSerializer
    filterset_class = CheckpointFilter

    def get_queryset(self):
        return exp_selectors.checkpoint_list(user=self.request.user)


class ProfileSweepViewSet(viewsets.ReadOnlyModelViewSet):
    """Profiling sweeps; start one with ``POST /api/devices/{id}/profile/``."""

    serializer_class = s.ProfileSweepSerializer
    filterset_fields = ["device", "status", "backend"]

    def get_queryset(self):
        return profiling_selectors.sweep_list()

    @extend_schema(request=None, responses={200: s.ProfileSweepSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk=None) -> Response:
        """Cancel a pending or running sweep (the user who started it, or lab staff): it ends
        ``cancelled``, its device is free for rounds at once, the agent stops measuring, and what
        it reports afterwards is dropped. 403 for anyone else, 409 once the sweep has ended."""
        sweep = profiling_services.sweep_cancel(sweep=self.get_object(), actor=request.user)
        return Response(s.ProfileSweepSerializer(sweep).data)


class ProfileSampleViewSet(viewsets.ReadOnlyModelViewSet):
    """Profile samples: one task of one measured co-located configuration (from sweeps and,
    the closed loop, from every measured assignment of FL rounds)."""

    serializer_class = s.ProfileSampleSerializer
    queryset = ProfileSample.objects.order_by("id")
    filterset_fields = ["device", "backend", "device_class", "source", "sweep", "architecture", "mix_size"]


class PredictorViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    """Throughput predictors. ``POST`` fits a new version on every profile sample of a backend
    and device class (in the control worker; ``status`` goes from ``fitting`` to ``ready``)."""

    serializer_class = s.PredictorSerializer
    queryset = Predictor.objects.order_by("-id")
    filterset_fields = ["backend", "device_class", "status"]

    @extend_schema(request=s.PredictorCreateSerializer, responses={202: s.PredictorSerializer})
    def create(self, request: Request) -> Response:
        predictor = profiling_services.predictor_request(**validated_data(s.PredictorCreateSerializer, request))
        return Response(s.PredictorSerializer(predictor).data, status=status.HTTP_202_ACCEPTED)


class ModelWorkloadViewSet(viewsets.ReadOnlyModelViewSet):
    """Workload features of the zoo's models (FLOPs, parameters, activation bytes per sample)."""

    serializer_class = s.ModelWorkloadSerializer
    queryset = ModelWorkload.objects.order_by("architecture", "num_classes")
    filterset_fields = ["architecture", "num_classes"]
