"""Dashboard pages (login required). Figures are built server-side and drawn by plotly.js."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render

from controlplane.dashboard import data
from controlplane.experiments import selectors
from controlplane.experiments.models import Experiment, Run, Task
from controlplane.fleet import selectors as fleet_selectors
from controlplane.profiling.models import Predictor, ProfileSweep
from controlplane.profiling.services.workloads import workload_get


@login_required
def index(request: HttpRequest) -> HttpResponse:
    devices = [(d, fleet_selectors.device_effective_status(d)) for d in fleet_selectors.device_list()]
    return render(
        request,
        "dashboard/index.html",
        {
            "experiments": selectors.experiment_list().prefetch_related("runs"),
            "devices": devices,
            "runs": selectors.run_list()[:20],
        },
    )


@login_required
def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = get_object_or_404(
        Experiment.objects.prefetch_related("tasks", "devices", "shards__device", "shards__task"), pk=pk
    )
    runs = data.experiment_runs(experiment)
    tasks = list(experiment.tasks.order_by("id"))
    return render(
        request,
        "dashboard/experiment.html",
        {
            "experiment": experiment,
            "tasks": tasks,
            "runs": runs,
            "figures": data.experiment_figures(experiment, runs),
        },
    )


@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("experiment"), pk=pk)
    live = data.run_live(run)
    return render(request, "dashboard/run.html", {"run": run, "live": live})


@login_required
def run_live(request: HttpRequest, pk: int) -> JsonResponse:
    """JSON the run page polls while the run is in progress."""
    run = get_object_or_404(Run.objects.select_related("experiment"), pk=pk)
    return JsonResponse(data.run_live(run))


@login_required
def predictor_list(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/predictors.html", {
        "predictors": Predictor.objects.order_by("-id")[:100],
        "sweeps": ProfileSweep.objects.select_related("device").order_by("-id")[:20],
    })


@login_required
def predictor_detail(request: HttpRequest, pk: int) -> HttpResponse:
    predictor = get_object_or_404(Predictor, pk=pk)
    return render(request, "dashboard/predictor.html", {
        "predictor": predictor,
        "families": data.predictor_families(predictor),
        "figures": data.predictor_figures(predictor),
    })


@login_required
def task_detail(request: HttpRequest, pk: int) -> HttpResponse:
    task = get_object_or_404(Task, pk=pk)
    return render(request, "dashboard/task.html", {
        "task": task,
        "workload": workload_get(architecture=task.architecture, num_classes=task.num_classes),
        "experiments": task.experiments.order_by("-id"),
    })
