"""An experiment's runs logged to an MLflow tracking store (``mtfl export EXPERIMENT --mlflow URI``),
so a researcher's usual tools (MLflow's UI, ``mlflow.search_runs``, pandas) plot and compare them.

Each mtfl run becomes one MLflow run in the MLflow experiment named after the mtfl experiment (or
a name given):

- **parameters** (:func:`run_params`): the strategy, the run's aggregator and its parameters (the
  run's own or the experiment's, ``aggregation.<name>``; per-task overrides
  ``task_aggregation.<task>``), the partition rule and its parameters (``partition.<name>``),
  rounds, local epochs, seed, participation, the run's planner options (``option.<name>``), and
  the first round's plan per device and task: ``batch_size.<device>.<task>`` and
  ``share.<device>.<task>`` (the MPS active-thread percentage);
- **metrics per round**, ``step`` = the rounds done (the round index + 1, the dashboard's x
  axis; step 0 is the initial model's test accuracy and loss), timestamp = when the round ended
  (the run's start for step 0): every figure of the tidy ``metrics`` table
  (:func:`controlplane.storage.exports.run_round_metrics`), whole-round ones by their name
  (``round_time_s``, ``wall_time_s``, ``elapsed_s``, ``fl_throughput_sps``, ``samples_trained``)
  and per task ``<metric>.<task>`` (``test_accuracy.<task>``, ``train_loss.<task>``,
  ``throughput_sps.<task>``, …);
- **whole-run metrics** (one value, at the step of the run's last round done):
  ``run.<figure>`` from the run's summary
  (throughputs, speedups over its ``temporal`` baseline, ``run.final_accuracy.<task>``) and, for a
  run of a comparison, ``comparison.<figure>`` / ``comparison.<figure>.<task>`` from the
  comparison's report (its own row: speedups, time to accuracy, rounds and samples to accuracy);
- **tags**: ``mtfl.installation`` (:func:`installation_id`), ``mtfl.run_id``,
  ``mtfl.experiment_id``, ``mtfl.strategy``, ``mtfl.status``, ``mtfl.comparison_id`` and
  ``mtfl.repeat`` (runs of a comparison), ``mtfl.fingerprint``;
  ``mlflow.runName`` ``<strategy> · run <id>``; the MLflow run's status and start/end times
  follow the mtfl run's;
- **artifacts**: ``mtfl/experiment.json`` (the experiment's setup, as the JSON export writes it)
  and, for a run of a comparison, ``mtfl/comparison-<id>.json`` (its whole report).

Re-exporting never duplicates a run: an MLflow run is found by its ``mtfl.installation``,
``mtfl.experiment_id`` and ``mtfl.run_id`` tags, so two control planes (a laptop's and the lab's,
whose run ids overlap) exporting to one tracking store under one experiment name never touch
each other's runs. When its ``mtfl.fingerprint`` (a SHA-256 of everything above, artifacts
included, so a comparison's report that changed when another repeat finished counts) is
unchanged it is **skipped**; when the mtfl run or its comparison changed since (more rounds, a
new status, an evaluation done) the old MLflow run is deleted (MLflow's soft delete: ``mlflow
gc`` removes it for good) and the run is logged again: it is **replaced**. MLflow's parameters
cannot change once logged, so replacing is the one way to update them.

MLflow's limits: a key is at most 250 characters of letters, digits, ``_ - . /`` and spaces, and
a ``/`` is a path separator to it (``a//b`` or a trailing ``/`` is refused). Names in keys are made
safe (:func:`safe_names`): each run of other characters, ``/`` included, becomes one ``_``, and
when two task names (or two keys) would then be one, those that were altered take ``-`` and 8
hex digits of their SHA-256, the same in every key of a task. A parameter's value is at most 500
characters here (the lowest limit of the MLflow versions in use; a longer one is cut with a
``…`` and the whole value is in ``mtfl/experiment.json``). ``mlflow-skinny`` (the ``mlflow``
extra) is enough: a ``file:`` store needs no database, ``sqlite:`` needs MLflow's SQLAlchemy
dependencies (the full ``mlflow`` package). MLflow 3 refuses a ``file:`` store unless
``MLFLOW_ALLOW_FILE_STORE`` is set; an export to one sets it for its own process, since the
researcher asked for that store by name.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.migrations.recorder import MigrationRecorder

from controlplane.experiments.models import Assignment, Checkpoint, Comparison, Experiment, Run
from controlplane.experiments.selectors import comparison_report
from controlplane.storage import exports

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

MAX_KEY = 250
"""MLflow's longest parameter, metric or tag key."""

MAX_PARAM_VALUE = 500
"""The longest parameter value written (MLflow 1.x and 2.x before 2.7 allow 500 characters)."""

BATCH_METRICS = 1000
"""Metrics per ``log_batch`` call (MLflow's limit: 1000 entities, at most 100 of them params)."""

BATCH_PARAMS = 100
"""Parameters per ``log_batch`` call (MLflow's limit)."""

MLFLOW_STATUS = {
    Run.Status.SUCCEEDED: "FINISHED",
    Run.Status.FAILED: "FAILED",
    Run.Status.CANCELLED: "KILLED",
}
"""The MLflow run status of an ended mtfl run; a run still pending or running stays ``RUNNING``."""

DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
"""Tracking URI schemes of MLflow's SQLAlchemy store (not in ``mlflow-skinny``)."""

SEARCH_PAGE = 1000
"""MLflow runs read per ``search_runs`` page when looking for runs exported before."""

NAME_HASH = 8
"""Hex digits of a name's SHA-256 that set apart names whose safe forms coincide."""

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. ]+")
"""Runs of characters a key part may not hold: MLflow refuses the others, and reads ``/`` as a
path separator (``a//b``, a trailing ``/``: refused)."""


class MlflowNotInstalled(RuntimeError):
    """MLflow is not installed (the ``mlflow`` extra)."""


class MlflowExportError(RuntimeError):
    """The tracking store refused or could not be reached; the message is one line."""


@dataclass
class RunPayload:
    """What one mtfl run becomes in MLflow (:func:`run_payload`).

    Attributes:
        run: the mtfl run.
        name: the MLflow run name.
        params: key → value (already within MLflow's limits).
        metrics: ``(key, value, step, timestamp ms)``.
        tags: key → value (the fingerprint not yet among them).
        artifacts: file name → JSON-serialisable content.
    """

    run: Run
    name: str
    params: dict[str, str] = field(default_factory=dict)
    metrics: list[tuple[str, float, int, int]] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """SHA-256 of the name, parameters, metrics, tags and artifacts: a run whose own rows are
        unchanged still changes when its comparison's report (an artifact) does, as it does when
        another repeat finishes."""
        content = json.dumps(
            [self.name, self.params, self.metrics, self.tags, self.artifacts], sort_keys=True, default=str
        )
        return hashlib.sha256(content.encode()).hexdigest()


@dataclass(frozen=True)
class ExportedRun:
    """One line of the export's report: the mtfl run, what happened (``"exported"``,
    ``"replaced"``, ``"skipped"``), the MLflow run id, and how many parameters and metric values
    it holds."""

    run: Run
    action: str
    mlflow_run_id: str
    params: int
    metric_values: int


def key_part(text: str) -> str:
    """``text`` with each run of characters a key may not hold (anything but letters, digits,
    ``_ - .`` and spaces; ``/`` included) replaced by one ``_``: ``"a//b:"`` → ``"a_b_"``."""
    return _KEY_UNSAFE.sub("_", text)


def safe_names(names: Iterable[str], limit: int = MAX_KEY) -> dict[str, str]:
    """Each of ``names`` → a distinct form MLflow keys take: :func:`key_part` cut to ``limit``
    characters, and where two names would get one form, each of them that was altered ends in
    ``-`` and :data:`NAME_HASH` hex digits of its SHA-256 (stable: the same name, the same form).
    A name that needs no change keeps it.

    Raises:
        MlflowExportError: two forms still coincide (a name already spelled as another's
            altered form, hash included).
    """
    forms = {name: key_part(name)[:limit] for name in set(names)}
    taken = Counter(forms.values())
    out = {}
    for name, form in forms.items():
        if form != name and taken[form] > 1:
            digest = hashlib.sha256(name.encode()).hexdigest()[:NAME_HASH]
            form = f"{form[: limit - NAME_HASH - 1]}-{digest}"
        out[name] = form
    still = Counter(out.values())
    clash = sorted(name for name, form in out.items() if still[form] > 1)
    if clash:
        raise MlflowExportError(f"names {clash!r} give one MLflow key: rename one of them")
    return out


def _task_part(tasks: Mapping[str, str], name: str) -> str:
    """The key part of task ``name``: its form in ``tasks`` (:func:`safe_names` of the
    experiment's tasks), or for a name not among them its :func:`key_part`, with its hash when
    altered (it cannot know which names it might meet)."""
    if name in tasks:
        return tasks[name]
    form = key_part(name)
    return form if form == name else f"{form}-{hashlib.sha256(name.encode()).hexdigest()[:NAME_HASH]}"


def installation_id() -> str:
    """A stable id of this control plane's database, tagged ``mtfl.installation`` on every
    MLflow run it exports: 16 hex digits of the SHA-256 of when the database's first migration
    was applied (``django_migrations``). It needs no state of its own, survives restarts and
    upgrades, and a second database (a laptop's beside the lab's, whose run ids overlap) has
    another; a copy of the database (a backup restored) keeps it, as it keeps the runs.

    Raises:
        MlflowExportError: the database has no migrations applied.
    """
    first = MigrationRecorder(connection).migration_qs.order_by("id").values_list("applied", flat=True).first()
    if first is None:
        raise MlflowExportError("the database has no migrations applied: run `mtfl migrate` first")
    return hashlib.sha256(f"mtfl-installation {first.isoformat()}".encode()).hexdigest()[:16]


def param_value(value: Any) -> str:
    """A parameter's value as MLflow stores it: JSON's spelling for booleans and null
    (``true``, ``null``), ``str()`` otherwise, cut to :data:`MAX_PARAM_VALUE` characters with a
    trailing ``…`` when longer."""
    text = json.dumps(value) if isinstance(value, bool) or value is None else str(value)
    return text if len(text) <= MAX_PARAM_VALUE else text[: MAX_PARAM_VALUE - 1] + "…"


def run_params(
    run: Run, experiment: Experiment, plan: Iterator[tuple[str, str, int, int]], tasks: Mapping[str, str]
) -> dict[str, str]:
    """The MLflow parameters of ``run`` (module docstring), keys made safe (:func:`safe_names`).

    Args:
        plan: ``(device, task, batch size, share %)`` of the run's first round.
        tasks: task name → its key part (:func:`experiment_task_parts`).

    Raises:
        MlflowExportError: two parameter names give one key (:func:`safe_names`).
    """
    aggregation = run.options.get("aggregation") or experiment.aggregation
    aggregation_params = run.options.get("aggregation_params") if run.options.get("aggregation") else None
    if aggregation_params is None:
        aggregation_params = experiment.aggregation_params if aggregation == experiment.aggregation else {}
    raw: dict[str, Any] = {
        "strategy": run.strategy,
        "aggregation": aggregation,
        **{f"aggregation.{name}": value for name, value in (aggregation_params or {}).items()},
        "partition_rule": experiment.partition_rule,
        **{f"partition.{name}": value for name, value in (experiment.partition_params or {}).items()},
        "rounds": experiment.rounds,
        "local_epochs": experiment.local_epochs,
        "seed": experiment.seed,
        "lr_scaling": experiment.lr_scaling,
        "clients_per_round": experiment.clients_per_round,
        "client_fraction": experiment.client_fraction,
        "client_sampling": experiment.client_sampling,
    }
    for task, override in exports.aggregation_settings(experiment)["task_aggregation"].items():
        part = _task_part(tasks, task)
        raw[f"task_aggregation.{part}"] = override.get("aggregation")
        for name, value in (override.get("aggregation_params") or {}).items():
            raw[f"task_aggregation.{part}.{name}"] = value
    for name, value in run.options.items():
        if name not in ("aggregation", "aggregation_params"):
            raw[f"option.{name}"] = value
    for device, task, batch_size, share in plan:
        raw[f"batch_size.{device}.{_task_part(tasks, task)}"] = batch_size
        raw[f"share.{device}.{_task_part(tasks, task)}"] = share
    keys = safe_names(raw)
    return {keys[name]: param_value(value) for name, value in raw.items()}


def experiment_task_parts(experiment: Experiment) -> dict[str, str]:
    """Every task name of ``experiment`` and of its runs' checkpoints (a task since removed from
    it) → its part of MLflow keys (:func:`safe_names`: one form per task, in every key). Two
    queries."""
    names = set(experiment.tasks.values_list("name", flat=True))
    names |= set(Checkpoint.objects.filter(run__experiment=experiment).values_list("task__name", flat=True).distinct())
    return safe_names(names)


def _first_plan(run: Run) -> Iterator[tuple[str, str, int, int]]:
    """``(device, task, batch size, share %)`` of the run's first planned round, by device and task."""
    first = run.rounds.order_by("index").values_list("index", flat=True).first()
    if first is None:
        return iter(())
    return iter(
        Assignment.objects.filter(round__run=run, round__index=first)
        .order_by("device__name", "task__name")
        .values_list("device__name", "task__name", "batch_size", "active_thread_percentage")
    )


def _ms(moment: dt.datetime | None, fallback: int) -> int:
    return int(moment.timestamp() * 1000) if moment is not None else fallback


def _figures(prefix: str, row: Mapping[str, Any], tasks: Mapping[str, str]) -> dict[str, float]:
    """The numbers of a summary or report row as ``{prefix.figure: value}``: plain numbers, an
    estimate's ``mean`` (``{"mean", "low", "high", ...}``), per task ``prefix.figure.<task>``
    (a row's ``tasks`` list, or a ``{task: number}`` mapping; ``<task>`` its key part in
    ``tasks``); ids, counts of runs and text are left out."""
    out: dict[str, float] = {}
    for name, value in row.items():
        if name in ("run", "repeat", "comparison", "task", "task_name", "options"):
            continue
        if isinstance(value, Mapping) and "mean" in value:
            value = value["mean"]
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) and exports.measured(value):
            out[f"{prefix}.{name}"] = float(value)
        elif isinstance(value, Mapping):
            for task, number in value.items():
                if isinstance(number, int | float) and not isinstance(number, bool) and exports.measured(number):
                    out[f"{prefix}.{name}.{_task_part(tasks, str(task))}"] = float(number)
        elif name == "tasks" and isinstance(value, list):
            for task_row in value:
                part = _task_part(tasks, str(task_row.get("task_name", task_row.get("task"))))
                for figure, number in _figures(prefix, task_row, tasks).items():
                    out[f"{figure}.{part}"] = number
    return out


def run_payload(
    run: Run,
    experiment: Experiment,
    summary: Mapping[str, Any],
    report: Mapping[str, Any] | None,
    *,
    installation: str,
    tasks: Mapping[str, str],
) -> RunPayload:
    """Everything ``run`` becomes in MLflow (module docstring).

    Args:
        summary: the run's summary (:func:`controlplane.storage.exports.run_summaries`).
        report: the report of the run's comparison
            (:func:`controlplane.experiments.selectors.comparison_report`), ``None`` for a run of
            its own.
        installation: this control plane's id (:func:`installation_id`).
        tasks: task name → its key part (:func:`experiment_task_parts`).

    Raises:
        MlflowExportError: two metric names give one key (:func:`safe_names`).
    """
    payload = RunPayload(run=run, name=f"{run.strategy} · run {run.id}")
    payload.params = run_params(run, experiment, _first_plan(run), tasks)
    started = _ms(run.started_at or run.created_at, 0)
    ends = dict(run.rounds.values_list("index", "finished_at"))
    raw: list[tuple[str, float, int, int]] = []
    for (done, task), figures in exports.run_round_metrics(run).items():
        # Step = rounds done; round k ended at its finished_at, the initial model at the start.
        when = _ms(ends.get(done - 1), started) if done else started
        for metric, value in figures.items():
            raw.append((metric if task is None else f"{metric}.{_task_part(tasks, task)}", value, done, when))
    whole = _figures("run", summary, tasks)
    if report is not None:
        own = next((row for row in report["runs"] if row["run"] == run.id), None)
        whole |= _figures("comparison", own or {}, tasks)
        payload.artifacts[f"mtfl/comparison-{report['comparison']}.json"] = report
    last = max((step for _, _, step, _ in raw), default=0)
    raw += [(name, value, last, _ms(run.finished_at, started)) for name, value in sorted(whole.items())]
    keys = safe_names({name for name, *_ in raw})
    payload.metrics = [(keys[name], value, step, when) for name, value, step, when in raw]
    payload.tags = {
        "mtfl.installation": installation,
        "mtfl.run_id": str(run.id),
        "mtfl.experiment_id": str(experiment.id),
        "mtfl.strategy": run.strategy,
        "mtfl.status": run.status,
    }
    if run.comparison_id is not None:
        payload.tags |= {"mtfl.comparison_id": str(run.comparison_id), "mtfl.repeat": str(run.repeat)}
    return payload


def mlflow_client(uri: str) -> MlflowClient:
    """A client of the tracking store at ``uri`` (``file:/path``, ``sqlite:///path.db``,
    ``http(s)://server``, or a folder path).

    Raises:
        MlflowNotInstalled: MLflow is not installed.
        MlflowExportError: an empty URI, a database URI without SQLAlchemy installed, or one
            MLflow refuses.
    """
    if not uri.strip():
        raise MlflowExportError("--mlflow is empty: give a tracking URI (file:/path/to/mlruns, sqlite:///mlflow.db)")
    try:
        # deferred: MLflow is an optional extra, imported only by an export to it
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise MlflowNotInstalled(
            "MLflow is not installed: pip install 'mtfl-lab[mlflow]' (mlflow-skinny is enough)"
        ) from exc
    scheme = uri.split(":", 1)[0].split("+", 1)[0] if ":" in uri else ""
    if scheme in DATABASE_SCHEMES and importlib.util.find_spec("sqlalchemy") is None:
        # mlflow-skinny's own message would be about the model registry's URI schemes.
        raise MlflowExportError(
            f"MLflow store {uri!r}: a {scheme}: store needs the full mlflow package (SQLAlchemy): "
            "pip install mlflow, or export to a file:/path/to/mlruns store"
        )
    if uri.startswith("file:") or "://" not in uri:
        # MLflow 3 refuses a file store unless asked for; the researcher named this one.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return _call(lambda: MlflowClient(tracking_uri=uri), uri)


def export_experiment(
    experiment: Experiment,
    uri: str,
    *,
    mlflow_experiment: str | None = None,
    on_run: Callable[[ExportedRun], None] | None = None,
) -> list[ExportedRun]:
    """Log every run of ``experiment`` (by id) to the MLflow store at ``uri`` (module docstring:
    what is logged, and re-exports: ``skipped`` when unchanged, ``replaced`` when changed).

    Args:
        mlflow_experiment: the MLflow experiment's name (default: the mtfl experiment's name);
            created when it does not exist.
        on_run: called after each run, as it is exported (a command prints its line).

    Returns:
        One :class:`ExportedRun` per run, by run id.

    Raises:
        MlflowNotInstalled: MLflow is not installed.
        MlflowExportError: the store refused or could not be reached, the MLflow experiment of
            that name is deleted, the database has no migrations, or two names give one key
            (one line).
    """
    client = mlflow_client(uri)
    name = (mlflow_experiment or experiment.name).strip() or experiment.name
    experiment_id = _call(lambda: _mlflow_experiment_id(client, name), uri)
    installation = installation_id()
    earlier = _call(lambda: _exported_before(client, experiment_id, installation, experiment.id), uri)
    tasks = experiment_task_parts(experiment)
    runs = list(experiment.runs.order_by("id"))
    summaries = {row["run"]: row for row in exports.run_summaries(experiment, runs)}
    reports: dict[int, dict[str, Any]] = {}
    setup = json.loads(json.dumps(exports.experiment_summary(experiment), default=str))
    done = []
    for run in runs:
        report = None
        if run.comparison_id is not None:
            if run.comparison_id not in reports:
                reports[run.comparison_id] = comparison_report(Comparison.objects.get(id=run.comparison_id))
            report = reports[run.comparison_id]
        payload = run_payload(run, experiment, summaries[run.id], report, installation=installation, tasks=tasks)
        payload.artifacts["mtfl/experiment.json"] = setup
        before = earlier.get(str(run.id), [])
        exported = _call(lambda p=payload, b=before: _log_run(client, experiment_id, p, b), uri)
        done.append(exported)
        if on_run is not None:
            on_run(exported)
    return done


def _call(action: Callable[[], Any], uri: str) -> Any:
    """``action()``, with what MLflow or the store raised as :class:`MlflowExportError`."""
    # deferred: MLflow is an optional extra (mlflow_client has imported it by now)
    from mlflow.exceptions import MlflowException

    try:
        return action()
    except (MlflowException, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise MlflowExportError(f"MLflow store {uri!r}: {first}") from exc


def _mlflow_experiment_id(client: MlflowClient, name: str) -> str:
    found = client.get_experiment_by_name(name)
    if found is None:
        return str(client.create_experiment(name))
    if found.lifecycle_stage != "active":
        raise MlflowExportError(
            f"MLflow experiment {name!r} is deleted: restore it (mlflow experiments restore) or give "
            "--mlflow-experiment another name"
        )
    return str(found.experiment_id)


def _exported_before(
    client: MlflowClient, experiment_id: str, installation: str, mtfl_experiment: int
) -> dict[str, list[Any]]:
    """The active MLflow runs this installation exported of ``mtfl_experiment`` into MLflow
    experiment ``experiment_id``, by their ``mtfl.run_id`` tag: only these may be skipped or
    replaced (another control plane's runs, or another experiment's sharing the MLflow
    experiment, are never touched). One search per :data:`SEARCH_PAGE` runs."""
    query = f"tags.`mtfl.installation` = '{installation}' and tags.`mtfl.experiment_id` = '{int(mtfl_experiment)}'"
    found: dict[str, list[Any]] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=query, max_results=SEARCH_PAGE, page_token=token)
        for run in page:
            found.setdefault(run.data.tags.get("mtfl.run_id", ""), []).append(run)
        token = page.token
        if not token:
            return found


def _log_run(client: MlflowClient, experiment_id: str, payload: RunPayload, existing: list[Any]) -> ExportedRun:
    """Log ``payload`` as one MLflow run: skip it when ``existing`` (this installation's MLflow
    runs of the same mtfl run, :func:`_exported_before`) is one run with the same fingerprint,
    else delete ``existing`` and log it anew."""
    # deferred: MLflow is an optional extra
    from mlflow.entities import Metric, Param

    fingerprint = payload.fingerprint()
    counts = (len(payload.params), len(payload.metrics))
    same = [r for r in existing if r.data.tags.get("mtfl.fingerprint") == fingerprint]
    if same and len(existing) == 1:
        return ExportedRun(payload.run, "skipped", same[0].info.run_id, *counts)
    for old in existing:
        client.delete_run(old.info.run_id)
    started = _ms(payload.run.started_at or payload.run.created_at, 0)
    created = client.create_run(
        experiment_id, start_time=started, tags={**payload.tags, "mtfl.fingerprint": fingerprint}, run_name=payload.name
    )
    mlflow_run = created.info.run_id
    params = [Param(k, v) for k, v in payload.params.items()]
    for i in range(0, len(params), BATCH_PARAMS):
        client.log_batch(mlflow_run, params=params[i : i + BATCH_PARAMS])
    metrics = [Metric(k, v, when, step) for k, v, step, when in payload.metrics]
    for i in range(0, len(metrics), BATCH_METRICS):
        client.log_batch(mlflow_run, metrics=metrics[i : i + BATCH_METRICS])
    for name, content in payload.artifacts.items():
        client.log_dict(mlflow_run, content, name)
    status = MLFLOW_STATUS.get(payload.run.status)
    if status is not None:
        client.set_terminated(mlflow_run, status, end_time=_ms(payload.run.finished_at, started))
    return ExportedRun(payload.run, "replaced" if existing else "exported", mlflow_run, *counts)
