"""Dashboard pages (login required). Figures are built server-side and drawn by plotly.js.

Forms post to the same services as the API, checked by the API's serializers
(:mod:`controlplane.dashboard.forms`): a page shows the API's message at the field it names.
An experiment and everything below it is its members' only (owner and collaborators): anyone
else gets 404, as from the API.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotFound, JsonResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils.text import slugify
from django.views.decorators.http import require_POST
from rest_framework.authentication import TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from controlplane.common.errors import ApplicationError
from controlplane.dashboard import data, figures
from controlplane.dashboard.forms import (
    CollaboratorsForm,
    CompareForm,
    DeviceForm,
    ExperimentForm,
    ExperimentFromTemplateForm,
    PredictorFitForm,
    ProfileForm,
    RunForm,
    TaskForm,
)
from controlplane.experiments import selectors
from controlplane.experiments.models import Comparison, Experiment, Run
from controlplane.experiments.services import (
    comparison_cancel,
    comparison_create,
    experiment_create,
    experiment_create_from_template,
    experiment_update,
    run_cancel,
    run_create,
    task_create,
)
from controlplane.experiments.services import sweeps as exp_sweeps
from controlplane.experiments.services.planner_check import planner_check
from controlplane.experiments.services.templates import DEFAULT_DIRICHLET_ALPHA, TEMPLATES, template_dataset_default
from controlplane.fleet import selectors as fleet_selectors
from controlplane.fleet.models import Device
from controlplane.fleet.services import device_create
from controlplane.lab import selectors as lab_selectors
from controlplane.lab.services.admin import device_pause, device_resume
from controlplane.planning.strategies import baseline_strategy, compared_strategies, planned_strategies
from controlplane.profiling import selectors as profiling_selectors
from controlplane.profiling import services as profiling_services
from controlplane.profiling.services.sweeps import sweep_cancel_allowed
from controlplane.profiling.services.workloads import workload_get
from controlplane.storage import exports
from controlplane.storage.services import retention

# --- the index: experiments, devices, recent runs ------------------------------------------------


def _index_context(request: HttpRequest, template_form: ExperimentFromTemplateForm, devices: dict) -> dict:
    experiments = selectors.experiment_index_list(user=request.user, device_names=data.INDEX_DEVICE_NAMES)
    disk = retention.experiments_disk_use(e.id for e in experiments)
    for e in experiments:
        e.disk_use = disk[e.id]
    totals = retention.storage_totals()
    return {
        "experiments": experiments,
        "storage": totals,
        "storage_problem": totals.problem,
        "devices": devices["rows"],
        "device_page": devices,
        "runs": selectors.run_list(user=request.user)[:20],
        "template_form": template_form,
        "templates": list(TEMPLATES.values()),
        "template_dataset": template_dataset_default(),
        "template_alpha": DEFAULT_DIRICHLET_ALPHA,
    }


@login_required
def index(request: HttpRequest) -> HttpResponse:
    try:
        devices = data.device_page(request.GET.get("devices_page"))
    except data.PageError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    return render(request, "dashboard/index.html", _index_context(request, ExperimentFromTemplateForm(), devices))


@login_required
@require_POST
def experiment_from_template(request: HttpRequest) -> HttpResponse:
    """The index page's "New experiment from a template" form: create it and go to its page,
    or show the index again with the API's message at the field it names."""
    form = ExperimentFromTemplateForm(request.POST)
    experiment = form.submit(experiment_create_from_template, owner=request.user)
    if experiment is not None:
        _warn_of_data_gaps(request, experiment)
        return redirect("dashboard:experiment", pk=experiment.pk)
    return render(
        request, "dashboard/index.html", _index_context(request, form, data.device_page(None)), status=form.status_code
    )


def _warn_of_data_gaps(request: HttpRequest, experiment: Experiment) -> None:
    """After creating an experiment: one message when its partition left devices without data
    (the experiment page, where it leads, lists them at the top)."""
    n = len(selectors.experiment_data_warnings(experiment))
    if n:
        messages.warning(
            request,
            f"Created, with {n} warning{pluralize(n)}: the partition leaves devices without data "
            "(listed below; every run of this experiment carries them).",
        )


def _form_page(
    request: HttpRequest, form, template: str, context: dict | None = None, status: int = 200
) -> HttpResponse:
    return render(request, template, {"form": form, **(context or {})}, status=status)


@login_required
def device_new(request: HttpRequest) -> HttpResponse:
    """Register a device of the lab's shared fleet; its agent serves it once started."""
    form = DeviceForm(request.POST or None)
    if request.method == "POST":
        device = form.submit(device_create)
        if device is not None:
            messages.success(
                request,
                f"Device {device.name} registered ({device.backend}). It shows as unknown until its agent "
                f"connects: on its host run  mtfl agent --device {device.name} --backend {device.backend}",
            )
            return redirect(reverse("dashboard:index") + "#devices")
        return _form_page(request, form, "dashboard/device_new.html", status=form.status_code)
    return _form_page(request, form, "dashboard/device_new.html")


# --- tasks (the lab's shared catalogue) --------------------------------------------------------


@login_required
def task_list(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/tasks.html", {"tasks": selectors.task_list()})


@login_required
def task_new(request: HttpRequest) -> HttpResponse:
    """Define a learning task, owned by the researcher (only they may change it)."""
    form = TaskForm(request.POST or None)
    if request.method == "POST":
        task = form.submit(task_create, owner=request.user)
        if task is not None:
            messages.success(request, f"Task {task.name} defined; the control worker computes its workload features.")
            return redirect("dashboard:task", pk=task.pk)
        return _form_page(request, form, "dashboard/task_new.html", status=form.status_code)
    return _form_page(request, form, "dashboard/task_new.html")


@login_required
def task_detail(request: HttpRequest, pk: int) -> HttpResponse:
    task = get_object_or_404(selectors.task_list(), pk=pk)
    return render(
        request,
        "dashboard/task.html",
        {
            "task": task,
            "input_shape": "×".join(str(n) for n in task.input_shape),
            "workload": workload_get(
                architecture=task.architecture, num_classes=task.num_classes, input_shape=task.input_shape
            ),
            "experiments": selectors.task_experiment_list(user=request.user, task=task),
        },
    )


# --- experiments ------------------------------------------------------------------------------------


@login_required
def experiment_new(request: HttpRequest) -> HttpResponse:
    """Create an experiment from tasks and devices of the catalogue; it belongs to its creator."""
    form = ExperimentForm(request.POST or None)
    if request.method == "POST":
        experiment = form.submit(experiment_create, owner=request.user)
        if experiment is not None:
            _warn_of_data_gaps(request, experiment)
            return redirect("dashboard:experiment", pk=experiment.pk)
        return _form_page(request, form, "dashboard/experiment_new.html", status=form.status_code)
    return _form_page(request, form, "dashboard/experiment_new.html")


def _member_experiment(request: HttpRequest, pk: int) -> Experiment:
    """The experiment if the user is one of its members (or a superuser); 404 otherwise."""
    return get_object_or_404(selectors.experiment_list(user=request.user), pk=pk)


@login_required
def experiment_detail(request: HttpRequest, pk: int) -> HttpResponse:
    experiment = get_object_or_404(selectors.experiment_page_list(user=request.user), pk=pk)
    return render(request, "dashboard/experiment.html", _experiment_context(request, experiment))


def _experiment_context(request: HttpRequest, experiment: Experiment, **overrides) -> dict:
    runs = data.experiment_runs(experiment)
    comparison = data.comparison_figures(experiment, runs)
    can_manage = selectors.can_manage_experiment(request.user, experiment)
    shown = {**data.experiment_figures(experiment, runs), **comparison["figures"]}
    tasks = selectors.experiment_tasks(experiment)
    histograms = data.experiment_label_histograms(experiment, tasks, devices_limit=figures.MAX_DEVICES)
    # The predicted-against-measured chart only means something once a planned strategy runs
    # here: an experiment of baselines only (mtfl demo's) gets no empty box for it.
    planned = set(planned_strategies())
    if figures.is_empty(shown["predicted"]) and not any(row["run"].strategy in planned for row in runs):
        del shown["predicted"]
    return {
        "experiment": experiment,
        "tasks": tasks,
        "runs": runs,
        "partition_parameters": data.partition_parameters(experiment),
        "fl_algorithm": data.experiment_aggregation(experiment),
        "label_histograms": histograms,
        "label_figures": [{"task": h["task"].pk, "figure": h["figure"]} for h in histograms],
        "figures": shown,
        "comparison": selectors.experiment_latest_comparison(experiment),
        "compared_runs": comparison["runs"],
        "report": data.report_table(comparison["report"]) if comparison["report"] else None,
        "planner_check": planner_check(experiment),
        "compare_error": "",
        "run_form": RunForm(experiment=experiment, tasks=tasks),
        "compare_form": CompareForm(experiment=experiment, tasks=tasks),
        "planned_strategies": " ".join(planned_strategies()),
        "planned_listing": _listing(planned_strategies()),
        "compared_listing": _listing(compared_strategies()),
        "baseline_strategy": baseline_strategy().name,
        "can_manage": can_manage,
        "collaborators": selectors.experiment_collaborator_names(experiment),
        "collaborators_form": CollaboratorsForm.for_experiment(experiment) if can_manage else None,
        "collaborators_error": "",
        "action_error": "",
        "disk_use": retention.experiments_disk_use([experiment.id])[experiment.id],
        "storage": retention.storage_totals(),
        "keep_last_checkpoints": retention.keep_last_checkpoints(experiment),
        "data_warnings": selectors.experiment_data_warnings(experiment),
        **overrides,
    }


def _listing(names: tuple[str, ...]) -> str:
    """``"a, b and c"``."""
    return f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else "".join(names)


def _experiment_page(request: HttpRequest, experiment: Experiment, status: int, **overrides) -> HttpResponse:
    return render(
        request, "dashboard/experiment.html", _experiment_context(request, experiment, **overrides), status=status
    )


@login_required
@require_POST
def experiment_compare(request: HttpRequest, pk: int) -> HttpResponse:
    """The experiment page's "Compare strategies" form: the chosen strategies (with the
    baseline), repeats, targets, objective and aggregator; launch the comparison and come back
    to the page, or show every refusal at its field (e.g. no predictor fitted yet)."""
    experiment = _member_experiment(request, pk)
    form = CompareForm(request.POST, experiment=experiment)
    if form.submit(comparison_create, experiment=experiment) is None:
        return _experiment_page(request, experiment, form.status_code, compare_form=form)
    return redirect("dashboard:experiment", pk=experiment.pk)


@login_required
@require_POST
def run_new(request: HttpRequest, pk: int) -> HttpResponse:
    """The experiment page's "Launch a run" form: start it and go to its page."""
    experiment = _member_experiment(request, pk)
    form = RunForm(request.POST, experiment=experiment)
    run = form.submit(run_create, experiment=experiment)
    if run is None:
        return _experiment_page(request, experiment, form.status_code, run_form=form)
    return redirect("dashboard:run", pk=run.pk)


@login_required
@require_POST
def experiment_collaborators(request: HttpRequest, pk: int) -> HttpResponse:
    """The owner's collaborators form. A collaborator who posts it gets the service's refusal."""
    experiment = _member_experiment(request, pk)
    form = CollaboratorsForm(request.POST)
    if form.submit(experiment_update, experiment=experiment, actor=request.user) is not None:
        messages.success(request, "Collaborators saved.")
        return redirect(reverse("dashboard:experiment", args=[experiment.pk]) + "#members")
    status = form.status_code
    if not selectors.can_manage_experiment(request.user, experiment):
        error = " ".join(form.errors.get("collaborators", []) + form.non_field_errors())
        return _experiment_page(request, experiment, status, collaborators_error=error)
    return _experiment_page(request, experiment, status, collaborators_form=form)


@login_required
@require_POST
def experiment_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The experiment page's "Delete the experiment" button (its owner, once no run of it is in
    progress): its runs and their artifacts go, and the index says how much was freed."""
    experiment = _member_experiment(request, pk)
    try:
        held = retention.experiment_delete(experiment=experiment, actor=request.user)
    except ApplicationError as exc:
        return _experiment_page(request, experiment, exc.status_code, action_error=exc.message)
    messages.success(
        request, f"Experiment {experiment.name!r} deleted: {retention.format_bytes(held.bytes)} of artifacts freed."
    )
    return redirect("dashboard:index")


@login_required
@require_POST
def comparison_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    """Cancel a running comparison: the run in flight is cancelled, the others never start."""
    comparison = get_object_or_404(selectors.comparison_list(user=request.user), pk=pk)
    try:
        comparison_cancel(comparison=comparison)
    except ApplicationError as exc:
        return _experiment_page(request, comparison.experiment, exc.status_code, compare_error=exc.message)
    return redirect("dashboard:experiment", pk=comparison.experiment_id)


# --- runs ---------------------------------------------------------------------------------------------


@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(selectors.run_page_list(user=request.user), pk=pk)
    return _run_page(request, run)


def _run_page(request: HttpRequest, run: Run, *, cancel_error: str = "", status: int = 200) -> HttpResponse:
    live = data.run_live(run)
    comparison = run.comparison if run.comparison_id and run.comparison.status == Comparison.Status.RUNNING else None
    # A finished run's page leaves out the figures with nothing to show (a run that failed before
    # its first round shows its error, not empty chart boxes); a run in progress keeps them all,
    # to fill in as rounds finish.
    shown = [name for name, fig in live["figures"].items() if not (run.is_finished and figures.is_empty(fig))]
    return render(
        request,
        "dashboard/run.html",
        {
            "run": run,
            "live": live,
            "cancel_error": cancel_error,
            "running_comparison": comparison,
            "figures_shown": shown,
            "round_plans": data.run_round_plans(run),
            "can_manage": selectors.can_manage_experiment(request.user, run.experiment),
            "disk_use": retention.run_disk_use(run.id),
        },
        status=status,
    )


@login_required
@require_POST
def run_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The run page's "Cancel the run" button: no further round starts."""
    run = get_object_or_404(selectors.run_list(user=request.user), pk=pk)
    try:
        run_cancel(run=run)
    except ApplicationError as exc:
        return _run_page(request, run, cancel_error=exc.message, status=exc.status_code)
    return redirect("dashboard:run", pk=run.pk)


@login_required
@require_POST
def run_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The run page's "Delete the run" button (the experiment's owner, once the run has ended):
    its rows and artifacts go, and the experiment page says how much was freed."""
    run = get_object_or_404(selectors.run_list(user=request.user), pk=pk)
    try:
        held = retention.run_delete(run=run, actor=request.user)
    except ApplicationError as exc:
        return _run_page(request, run, cancel_error=exc.message, status=exc.status_code)
    messages.success(request, f"Run {pk} deleted: {retention.format_bytes(held.bytes)} of artifacts freed.")
    return redirect("dashboard:experiment", pk=run.experiment_id)


@login_required
def run_live(request: HttpRequest, pk: int) -> JsonResponse:
    """JSON the run page polls while the run is in progress."""
    run = get_object_or_404(selectors.run_list(user=request.user), pk=pk)
    return JsonResponse(data.run_live(run))


# --- downloads -------------------------------------------------------------------------------------


def login_or_token_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Like ``login_required``, and a request may also authenticate with the API's token
    (``Authorization: Token <key>``), so a script downloads results as it calls the API.

    A request with a session is served as before; a bad or inactive token gets 401 with the
    API's message (never the login page); no credentials at all redirect to the login page.
    """

    @functools.wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if not request.user.is_authenticated:
            try:
                found = TokenAuthentication().authenticate(request)
            except AuthenticationFailed as exc:
                response = JsonResponse({"detail": str(exc.detail)}, status=401)
                response["WWW-Authenticate"] = TokenAuthentication().authenticate_header(request)
                return response
            if found is not None:
                request.user = found[0]
        return login_required(view)(request, *args, **kwargs)

    return wrapped


def _download(chunks, content_type: str, filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(chunks, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _check_table(table: str) -> HttpResponse | None:
    """``None`` for a table the exports have; else a plain-text 404 naming the allowed tables
    (Django's own 404 page would say only "Not Found", as it does with DEBUG off)."""
    if table in exports.TABLES:
        return None
    return HttpResponseNotFound(exports.unknown_table_message(table) + "\n", content_type="text/plain; charset=utf-8")


@login_or_token_required
def run_csv(request: HttpRequest, pk: int, table: str) -> HttpResponse | StreamingHttpResponse:
    """A run's ``rounds``, ``assignments`` or tidy ``metrics`` as CSV, streamed."""
    if (refused := _check_table(table)) is not None:
        return refused
    run = get_object_or_404(selectors.run_list(user=request.user), pk=pk)
    return _download(
        exports.csv_chunks(table, selectors.run_only(run)),
        "text/csv; charset=utf-8",
        f"run-{run.pk}-{run.strategy}-{table}.csv",
    )


@login_or_token_required
def run_json(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """A run with its rounds and assignments as JSON, streamed."""
    run = get_object_or_404(selectors.run_list(user=request.user), pk=pk)
    return _download(
        exports.json_chunks(run.experiment, selectors.run_only(run)),
        "application/json",
        f"run-{run.pk}-{run.strategy}.json",
    )


@login_or_token_required
def experiment_csv(request: HttpRequest, pk: int, table: str) -> HttpResponse | StreamingHttpResponse:
    """The ``rounds``, ``assignments`` or tidy ``metrics`` of every run of an experiment as CSV, streamed."""
    if (refused := _check_table(table)) is not None:
        return refused
    experiment = _member_experiment(request, pk)
    return _download(
        exports.csv_chunks(table, selectors.experiment_runs_all(experiment)),
        "text/csv; charset=utf-8",
        f"experiment-{experiment.pk}-{slugify(experiment.name)}-{table}.csv",
    )


@login_or_token_required
def experiment_json(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """An experiment, its runs, and all their rounds and assignments as JSON, streamed."""
    experiment = _member_experiment(request, pk)
    return _download(
        exports.json_chunks(experiment, selectors.experiment_runs_all(experiment)),
        "application/json",
        f"experiment-{experiment.pk}-{slugify(experiment.name)}.json",
    )


@login_or_token_required
def experiment_label_histograms_csv(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """Every device's class histogram of every task of an experiment as CSV, the numbers of the
    page's label histograms (:func:`data.label_histogram_csv_chunks` has the columns)."""
    experiment = _member_experiment(request, pk)
    histograms = data.experiment_label_histograms(experiment, selectors.experiment_tasks(experiment))
    return _download(
        data.label_histogram_csv_chunks(histograms),
        "text/csv; charset=utf-8",
        f"experiment-{experiment.pk}-{slugify(experiment.name)}-label-histograms.csv",
    )


# --- profiling and predictors -----------------------------------------------------------------------

SWEEP_REFRESH_S = 2
"""How often a sweep's page reloads its progress while the sweep runs, seconds."""

SWEEP_TABLE_ROWS = 50
"""Configurations a finished sweep's page lists (the API has every sample)."""


@login_required
def profile_new(request: HttpRequest) -> HttpResponse:
    """Profile a device: start a sweep (as ``mtfl profile`` does) and go to its page, which
    follows it. ``?device=<id>`` preselects the device (the device list's links)."""
    if request.method == "POST":
        form = ProfileForm(request.POST, user=request.user)
        sweep = form.submit(exp_sweeps.sweep_start, actor=request.user)
        if sweep is not None:
            return redirect("dashboard:sweep", pk=sweep.pk)
        return _form_page(request, form, "dashboard/profile_new.html", status=form.status_code)
    return _form_page(
        request,
        ProfileForm(initial={"device": request.GET.get("device", "")}, user=request.user),
        "dashboard/profile_new.html",
    )


def _sweep_context(request: HttpRequest, sweep, **overrides) -> dict:
    finished = sweep.ended
    return {
        "sweep": sweep,
        "progress_percent": round(100 * profiling_selectors.sweep_progress(sweep)),
        "finished": finished,
        "may_cancel": not finished and sweep_cancel_allowed(sweep, request.user),
        "configurations": profiling_selectors.sweep_configurations(sweep, limit=SWEEP_TABLE_ROWS) if finished else [],
        "device_class": fleet_selectors.device_class(sweep.device),
        "refresh_s": SWEEP_REFRESH_S,
        **overrides,
    }


@login_required
def sweep_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A profiling sweep: its progress while it runs (the page reloads its status every
    :data:`SWEEP_REFRESH_S` s), a cancel button for whoever started it and lab staff, what it
    measured once done, and the way on to fitting a predictor."""
    sweep = get_object_or_404(profiling_selectors.sweep_list(), pk=pk)
    return render(request, "dashboard/sweep.html", _sweep_context(request, sweep))


@login_required
def sweep_status(request: HttpRequest, pk: int) -> HttpResponse:
    """A sweep page's status part alone, which the page fetches while the sweep runs."""
    sweep = get_object_or_404(profiling_selectors.sweep_list(), pk=pk)
    return render(request, "dashboard/_sweep_status.html", _sweep_context(request, sweep))


@login_required
@require_POST
def sweep_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The sweep page's "Cancel the sweep" button (whoever started it, or lab staff): the sweep
    ends ``cancelled``, the agent stops measuring and its device is free for rounds at once."""
    sweep = get_object_or_404(profiling_selectors.sweep_list(), pk=pk)
    try:
        profiling_services.sweep_cancel(sweep=sweep, actor=request.user)
    except ApplicationError as exc:
        context = _sweep_context(request, sweep, cancel_error=exc.message)
        return render(request, "dashboard/sweep.html", context, status=exc.status_code)
    messages.success(request, f"Sweep {sweep.pk} cancelled: {sweep.device.name} is free for rounds again.")
    return redirect("dashboard:sweep", pk=sweep.pk)


@login_required
def predictor_new(request: HttpRequest) -> HttpResponse:
    """Fit a predictor on a device class's samples (as ``POST /api/predictors/``): the control
    worker fits it, and its page follows the fit and shows its held-out error. Any researcher
    may: a fit only reads the shared samples (:func:`~controlplane.profiling.services.predictor_request`)."""
    if request.method == "POST":
        form = PredictorFitForm(request.POST)
        predictor = form.submit(profiling_services.predictor_request)
        if predictor is not None:
            return redirect("dashboard:predictor", pk=predictor.pk)
        return _form_page(request, form, "dashboard/predictor_new.html", status=form.status_code)
    initial = {k: request.GET[k] for k in ("backend", "device_class") if request.GET.get(k)}
    return _form_page(request, PredictorFitForm(initial=initial or None), "dashboard/predictor_new.html")


@login_required
def predictor_list(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "dashboard/predictors.html",
        {
            "predictors": profiling_selectors.predictor_list()[:100],
            "sweeps": profiling_selectors.sweep_list()[:20],
        },
    )


PREDICTOR_REFRESH_S = 2
"""How often a predictor's page reloads while the control worker fits it, seconds."""


@login_required
def predictor_detail(request: HttpRequest, pk: int) -> HttpResponse:
    predictor = get_object_or_404(profiling_selectors.predictor_list(), pk=pk)
    return render(
        request,
        "dashboard/predictor.html",
        {
            "predictor": predictor,
            "families": data.predictor_families(predictor),
            "figures": data.predictor_figures(predictor),
            "refresh_s": PREDICTOR_REFRESH_S,
        },
    )


# --- the lab queue ----------------------------------------------------------------------------------

QUEUE_REFRESH_S = 3
"""How often the queue page reloads its tables, seconds."""


def _queue_context(request: HttpRequest) -> dict:
    state = lab_selectors.queue_state()
    run_ids = {w["run"] for w in state["waiting"]} | {d["holder"]["run"] for d in state["devices"] if d["holder"]}
    # Every user sees the whole queue; a run's page only its experiment's members (others' 404).
    visible = selectors.visible_run_ids(user=request.user, run_ids=run_ids)
    return {"queue": state, "visible_runs": visible, "refresh_s": QUEUE_REFRESH_S}


@login_required
def queue_page(request: HttpRequest) -> HttpResponse:
    """The shared lab's queue: per device who holds it and since when, who waits and the
    estimated start, the waiting rounds in the policy's order; admins pause and resume devices."""
    return render(request, "dashboard/queue.html", _queue_context(request))


@login_required
def queue_tables(request: HttpRequest) -> HttpResponse:
    """The queue page's tables alone, which the page fetches every :data:`QUEUE_REFRESH_S` s."""
    return render(request, "dashboard/_queue_tables.html", _queue_context(request))


def _lab_admin_device(request: HttpRequest, pk: int) -> Device:
    if not request.user.is_staff:
        raise PermissionDenied("only a lab admin (a staff user) may pause or resume a device")
    return get_object_or_404(fleet_selectors.device_list(), pk=pk)


@login_required
@require_POST
def device_pause_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The queue page's "Pause" button (lab admins): no new round gets the device."""
    device = _lab_admin_device(request, pk)
    try:
        device_pause(device=device, user=request.user, reason=request.POST.get("reason", "").strip()[:200])
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{device.name} is paused: no new round gets it until it is resumed")
    return redirect("dashboard:queue")


@login_required
@require_POST
def device_resume_view(request: HttpRequest, pk: int) -> HttpResponse:
    """The queue page's "Resume" button (lab admins): waiting rounds may have the device again."""
    device = _lab_admin_device(request, pk)
    try:
        device_resume(device=device, user=request.user)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(request, f"{device.name} is resumed")
    return redirect("dashboard:queue")
