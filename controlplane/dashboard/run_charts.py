"""The run page's learning curves: each task's test accuracy and test loss after every round
and its training loss in the round, as a chart and as a table.

The values are read as stored: a checkpoint's test accuracy and loss
(:class:`~controlplane.experiments.models.Checkpoint`, filled in by
:mod:`controlplane.experiments.services.evaluation`) and the devices' training losses
(``Assignment.train_loss``) averaged per round and task by the database
(:func:`controlplane.experiments.selectors.run_task_train_losses`). Rounds are counted as the
experiment page counts them: *rounds done*, 0 being the initial model, so the training loss of
round index ``k`` stands at ``k + 1``, beside the accuracy of the model that training made.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from controlplane.dashboard.figures import EMPTY, LAYOUT, MAX_POINTS, PALETTE, bucket_means
from controlplane.experiments import selectors
from controlplane.experiments.models import Checkpoint, Run

TABLE_ROUNDS = 100
"""Rounds the run page's learning table lists (the newest; the checkpoints in the API and the
run's JSON download have them all)."""

EVALUATION_NOTES = {
    Checkpoint.Evaluation.PENDING: "evaluating",
    Checkpoint.Evaluation.FAILED: "evaluation failed",
}
"""What the table says in place of a checkpoint's accuracy that is not there (see
:class:`~controlplane.experiments.models.Checkpoint`)."""


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def run_learning(run: Run) -> list[dict[str, Any]]:
    """Per task and rounds done, what the run learned: ``{"rounds_done", "task",
    "test_accuracy", "test_loss", "train_loss", "devices", "note"}`` sorted by rounds done then
    task; ``rounds_done`` 0 is the initial model (it has no training loss). ``test_accuracy`` is
    a fraction in [0, 1], the losses are mean cross-entropies (nats); a value not measured
    (pending or failed evaluation, the ``simulated`` backend's training, a round no device
    trained the task in) is ``None``, and ``note`` says why when the checkpoint says so.
    ``devices``: how many devices' losses ``train_loss`` averages. Two queries.
    """
    rows: dict[tuple[int, str], dict[str, Any]] = {}

    def row(rounds_done: int, task: str) -> dict[str, Any]:
        return rows.setdefault(
            (rounds_done, task),
            {
                "rounds_done": rounds_done,
                "task": task,
                "test_accuracy": None,
                "test_loss": None,
                "train_loss": None,
                "devices": 0,
                "note": "",
            },
        )

    for task, index, accuracy, loss, evaluation, kept_previous in selectors.run_checkpoint_metrics(run):
        r = row(0 if index is None else index + 1, task)
        r["test_accuracy"], r["test_loss"] = _finite(accuracy), _finite(loss)
        notes = [EVALUATION_NOTES.get(evaluation, "")]
        if kept_previous:
            notes.append("no device trained it: the previous model kept")
        r["note"] = "; ".join(n for n in notes if n)
    for index, task, loss, devices in selectors.run_task_train_losses(run):
        r = row(index + 1, task)
        r["train_loss"], r["devices"] = _finite(loss), devices
    return [rows[key] for key in sorted(rows)]


def _line(rows: Sequence[Mapping[str, Any]], task: str, key: str) -> tuple[list[tuple[float, float]], int]:
    """``(rounds done, value)`` of one task's ``key``, averaged down to :data:`MAX_POINTS`."""
    points = [(float(r["rounds_done"]), r[key]) for r in rows if r["task"] == task and r[key] is not None]
    return bucket_means(points, MAX_POINTS)


def learning_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Two panels over rounds done (0: the initial model): each task's test accuracy above, its
    training loss (solid) and test loss (dotted) below, one colour per task.

    Args:
        rows: :func:`run_learning`'s rows.

    Returns:
        The figure, or one that says nothing was measured yet (``layout.meta`` :data:`EMPTY`).
    """
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    tasks = sorted({r["task"] for r in rows})
    merged = 1
    drawn = False
    for i, task in enumerate(tasks):
        color = PALETTE[i % len(PALETTE)]
        for key, panel, name, dash in (
            ("test_accuracy", 1, "test accuracy", "solid"),
            ("train_loss", 2, "training loss", "solid"),
            ("test_loss", 2, "test loss", "dot"),
        ):
            points, k = _line(rows, task, key)
            if not points:
                continue
            merged, drawn = max(merged, k), True
            fig.add_scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="lines+markers" if k == 1 else "lines",
                name=f"{task} · {name}",
                legendgroup=task,
                line=dict(color=color, dash=dash),
                hovertemplate=f"round %{{x}}: %{{y:.4f}}<extra>{task} · {name}</extra>",
                row=panel,
                col=1,
            )
    title = "Test accuracy and loss per round"
    if merged > 1:
        title += f"<br><sup>each point the mean of {merged} consecutive rounds</sup>"
    fig.update_layout(**{**LAYOUT, "height": 520, "legend": dict(orientation="h", yanchor="top", y=-0.12, x=0)})
    fig.update_layout(title=title)
    fig.update_yaxes(title_text="test accuracy", rangemode="tozero", row=1, col=1)
    # The losses' own range: from zero, a loss going from 2.30 to 2.28 would be a flat line.
    fig.update_yaxes(title_text="cross-entropy loss", row=2, col=1)
    fig.update_xaxes(title_text="rounds done (0: the initial model)", row=2, col=1)
    if merged == 1 and max((r["rounds_done"] for r in rows), default=0) <= 30:
        fig.update_xaxes(dtick=1)  # whole rounds, not 0.5
    if not drawn:
        fig.add_annotation(
            text="no accuracy or loss measured yet",
            showarrow=False,
            font=dict(size=15, color="#6a737d"),
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
        fig.update_xaxes(visible=False)
        fig.update_yaxes(visible=False)
        fig.update_layout(meta=EMPTY)
    return fig


def learning_table(rows: Sequence[Mapping[str, Any]], *, limit: int = TABLE_ROUNDS) -> dict[str, Any]:
    """The learning curves as a table, newest rounds first: ``{"tasks": [names], "rounds":
    [{"rounds_done", "cells": [row or None per task]}], "shown", "total"}`` with at most
    ``limit`` rounds (the newest).

    Args:
        rows: :func:`run_learning`'s rows.
    """
    tasks = sorted({r["task"] for r in rows})
    by_round: dict[int, dict[str, Mapping[str, Any]]] = {}
    for r in rows:
        by_round.setdefault(r["rounds_done"], {})[r["task"]] = r
    newest = sorted(by_round, reverse=True)[:limit]
    return {
        "tasks": tasks,
        "rounds": [
            {"rounds_done": n, "cells": [dict(by_round[n][t]) if t in by_round[n] else None for t in tasks]}
            for n in newest
        ],
        "shown": len(newest),
        "total": len(by_round),
    }
