"""``mtfl export EXPERIMENT``: an experiment's runs to an experiment tracker (``--mlflow URI``:
one MLflow run per run, :mod:`controlplane.storage.mlflow_export`) and/or its per-round, per-task
metrics as one tidy long-format CSV (``--csv PATH``: the ``metrics`` table of
:mod:`controlplane.storage.exports`)."""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from controlplane.core.cli_support import experiment_by_id_or_name
from controlplane.experiments.models import Experiment
from controlplane.storage import exports, mlflow_export


class Command(BaseCommand):
    help = (
        "Export an experiment's runs: to MLflow (--mlflow URI: one MLflow run per run, with its parameters, "
        "per-round metrics and the comparison's figures) and/or as one tidy CSV of per-round, per-task metrics "
        "(--csv PATH). Re-exporting to MLflow skips unchanged runs and replaces changed ones, this control "
        "plane's only."
    )

    def add_arguments(self, parser):
        parser.add_argument("experiment", help="the experiment's id or name")
        parser.add_argument(
            "--mlflow",
            metavar="URI",
            default=None,
            help="an MLflow tracking URI: file:/path/to/mlruns, sqlite:///mlflow.db (needs the full mlflow "
            "package), http://server:5000 (needs pip install 'mtfl-lab[mlflow]')",
        )
        parser.add_argument(
            "--mlflow-experiment",
            metavar="NAME",
            default=None,
            help="the MLflow experiment's name (default: the experiment's name); created when missing",
        )
        parser.add_argument(
            "--csv",
            metavar="PATH",
            default=None,
            help="write the tidy metrics table (experiment, run, strategy, comparison, repeat, round, rounds_done, "
            "task, metric, value) to PATH ('-': standard output)",
        )

    def handle(self, *args, **opts):
        if opts["mlflow"] is None and opts["csv"] is None:
            raise CommandError("nothing to export to: give --mlflow URI and/or --csv PATH")
        experiment = experiment_by_id_or_name(opts["experiment"])
        if opts["csv"] is not None:
            self._csv(experiment, opts["csv"])
        if opts["mlflow"] is not None:
            self._mlflow(experiment, opts["mlflow"], opts["mlflow_experiment"])

    def _csv(self, experiment: Experiment, path: str) -> None:
        runs = experiment.runs.all()
        chunks = exports.csv_chunks("metrics", runs)
        if path == "-":
            for chunk in chunks:
                sys.stdout.write(chunk)
            return
        lines = 0
        try:
            with Path(path).open("w", encoding="utf-8", newline="") as out:
                for chunk in chunks:
                    out.write(chunk)
                    lines += chunk.count("\n")
        except OSError as exc:
            raise CommandError(f"--csv {path}: {exc.strerror or exc}") from exc
        self.stdout.write(f"{max(lines - 1, 0)} metric values of {runs.count()} runs written to {path}")

    def _mlflow(self, experiment: Experiment, uri: str, name: str | None) -> None:
        def line(done: mlflow_export.ExportedRun) -> None:
            run = done.run
            where = f", comparison {run.comparison_id} repeat {run.repeat}" if run.comparison_id else ""
            self.stdout.write(
                f"run {run.id} ({run.strategy}, {run.status}{where}): {done.action} as MLflow run "
                f"{done.mlflow_run_id} ({done.params} params, {done.metric_values} metric values)"
            )

        try:
            done = mlflow_export.export_experiment(experiment, uri, mlflow_experiment=name, on_run=line)
        except (mlflow_export.MlflowNotInstalled, mlflow_export.MlflowExportError) as exc:
            raise CommandError(str(exc)) from exc
        target = name or experiment.name
        self.stdout.write(
            f"{len(done)} runs of {experiment.name!r} in MLflow experiment {target!r} at {uri} "
            f"(tag mtfl.installation={mlflow_export.installation_id()}: this control plane's)"
        )
