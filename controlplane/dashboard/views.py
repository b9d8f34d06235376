"""Dashboard pages (login required). Figures are built server-side and drawn by plotly.js."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from controlplane.common.errors import ApplicationError
from controlplane.dashboard import data
from controlplane.dashboard.forms import ExperimentFromTemplateForm
from controlplane.experiments import selectors
from controlplane.experiments.models import Experiment, Task
from controlplane.experiments.services import comparison_create, experiment_create_from_template
from controlplane.experiments.services.templates import DEFAULT_DIRICHLET_ALPHA, TEMPLATES, template_dataset_default
from controlplane.fleet import selectors as fleet_selectors
from controlplane.profiling.models import Predictor, ProfileSweep
from controlplane.profiling.services.workloads import workload_get


def _index_context(request: HttpRequest, template_form: ExperimentFromTemplateForm) -> dict:
    devices = [(d, fleet_selectors.device_effective_status(d)) for d in fleet_selectors.device_list()]
    return {
        "experiments": selectors.experiment_list(user=request.user).prefetch_related("runs"),
        "devices": devices,
        "runs": selectors.run_list(user=request.user)[:20],
        "template_form": template_form,
        "templates": list(TEMPLATES.values()),
        "template_dataset": template_dataset_default(),
        "template_alpha": DEFAULT_DIRICHLET_ALPHA,
    }


@login_required
def index(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/index.html", _index_context(request, ExperimentFromTemplateForm()))


@login_required
@require_POST
def experiment_from_template(request: HttpRequest) -> HttpResponse:
    """The index page's "New experiment from a template" form: create it and go to its page,
    or show the index again with the service's message at the field it names."""
    form = ExperimentFromTemplateForm(request.POST)
    if form.is_valid():
        try:
            experiment = experiment_create_from_template(owner=request.user, **form.service_arguments())
        except ApplicationError as exc:
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        else:
            return redirect("dashboard:experiment", pk=experiment.pk)
    return render(request, "dashboard/index.html", _index_context(request, form), status=400)


@login_required
def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = get_object_or_404(
        selectors.experiment_list(user=request.user).prefetch_related("shards__device", "shards__task"), pk=pk
    )
    return render(request, "dashboard/experiment.html", _experiment_context(experiment))


def _experiment_context(experiment: Experiment, compare_error: str = "") -> dict:
    runs = data.experiment_runs(experiment)
    comparison = data.comparison_figures(experiment, runs)
    return {
        "experiment": experiment,
        "tasks": list(experiment.tasks.order_by("id")),
        "runs": runs,
        "figures": {**data.experiment_figures(experiment, runs), **comparison["figures"]},
        "comparison": experiment.comparisons.order_by("-id").first(),
        "compared_runs": comparison["runs"],
        "compare_error": compare_error,
    }


@login_required
@require_POST
def experiment_compare(request: HttpRequest, pk: int) -> HttpResponse:
    """The experiment page's "Compare all strategies" button: launch a comparison and come
    back to the page, or show the service's message (e.g. no predictor fitted yet)."""
    experiment = get_object_or_404(selectors.experiment_list(user=request.user), pk=pk)
    try:
        comparison_create(experiment=experiment)
    except ApplicationError as exc:
        return render(request, "dashboard/experiment.html", _experiment_context(experiment, exc.message), status=400)
    return redirect("dashboard:experiment", pk=experiment.pk)


@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(selectors.run_list(user=request.user), pk=pk)
    live = data.run_live(run)
    return render(request, "dashboard/run.html", {"run": run, "live": live})


@login_required
def run_live(request: HttpRequest, pk: int) -> JsonResponse:
    """JSON the run page polls while the run is in progress."""
    run = get_object_or_404(selectors.run_list(user=request.user), pk=pk)
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
        "experiments": selectors.experiment_list(user=request.user).filter(tasks=task),
    })
