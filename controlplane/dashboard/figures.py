"""Pure figure builders: plain data in, ``plotly.graph_objects.Figure`` out.

No Django here: views collect rows with selectors and pass dictionaries, so every figure can be
tested and reused (e.g. for a report) without a database.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import plotly.graph_objects as go

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
LAYOUT = dict(
    template="plotly_white", margin=dict(l=60, r=20, t=50, b=50), height=380,
    legend=dict(orientation="h", yanchor="top", y=-0.2, x=0),
)


def _empty(fig: go.Figure, message: str) -> go.Figure:
    """Say there is nothing to show instead of drawing empty axes (Plotly defaults a date axis
    without data to the year 2000)."""
    fig.add_annotation(text=message, showarrow=False, font=dict(size=15, color="#6a737d"),
                       xref="paper", yref="paper", x=0.5, y=0.5)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return fig


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def speedup_bars(rows: Sequence[Mapping]) -> go.Figure:
    """Raw and fair throughput speedup over ``temporal``, one bar pair per strategy.

    Args:
        rows: ``{"label", "raw_speedup", "fair_speedup"}`` per bar pair, usually one per strategy
            (speedups may be None when no ``temporal`` run has succeeded yet: shown as n/a).
    """
    strategies = [r["label"] for r in rows]
    fig = go.Figure()
    if not rows:
        fig.update_layout(title="Speedup over temporal", **LAYOUT)
        return _empty(fig, "no succeeded run yet")
    for metric, label, color in (("raw_speedup", "raw throughput", PALETTE[0]), ("fair_speedup", "fair throughput", PALETTE[1])):
        values = [r.get(metric) for r in rows]
        fig.add_bar(
            name=label, x=strategies, y=values, marker_color=color,
            text=[f"{v:.2f}×" if v is not None else "n/a" for v in values], textposition="outside",
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555", annotation_text="temporal = 1×",
                  annotation_position="top right")
    fig.update_layout(
        title="Speedup over temporal (mean over rounds and devices)", barmode="group",
        yaxis_title="speedup (×)", xaxis_title="strategy", **LAYOUT,
    )
    return fig


def accuracy_over_time(series: Sequence[Mapping]) -> go.Figure:
    """Test accuracy of each task's global model against wall-clock time since the run started.

    Args:
        series: ``{"strategy", "run", "task", "points": [(seconds, accuracy), ...]}``.
    """
    fig = go.Figure()
    tasks = sorted({s["task"] for s in series})
    strategies = sorted({s["strategy"] for s in series})
    dashes = ["solid", "dash", "dot", "dashdot", "longdash"]
    for s in series:
        xs = [p[0] for p in s["points"]]
        ys = [p[1] for p in s["points"]]
        fig.add_scatter(
            x=xs, y=ys, mode="lines+markers", name=f"{s['strategy']} · {s['task']} (run {s['run']})",
            line=dict(color=_color(strategies.index(s["strategy"])), dash=dashes[tasks.index(s["task"]) % len(dashes)]),
        )
    fig.update_layout(
        title="Test accuracy against wall-clock time", xaxis_title="seconds since the run started",
        yaxis_title="test accuracy", yaxis_range=[0, 1], **{**LAYOUT, "height": 460},
    )
    return fig if series else _empty(fig, "no run yet")


def allocation_plan(assignments: Sequence[Mapping], *, round_indices: Sequence[int]) -> go.Figure:
    """The allocation plan of each round: per device, stacked bars of each task's share (%),
    batch sizes as labels, a line at 100 %; a menu switches between rounds (last one shown).

    Args:
        assignments: ``{"round_index", "device", "task", "active_thread_percentage",
            "batch_size"}`` per assignment.
        round_indices: the rounds to offer, in order.
    """
    fig = go.Figure()
    tasks = sorted({a["task"] for a in assignments})
    devices = sorted({a["device"] for a in assignments})
    by_round: dict[int, list[Mapping]] = defaultdict(list)
    for a in assignments:
        by_round[a["round_index"]].append(a)
    traces_of_round: dict[int, list[int]] = {}
    last = round_indices[-1] if round_indices else None
    for r in round_indices:
        traces_of_round[r] = []
        for t_i, task in enumerate(tasks):
            rows = {a["device"]: a for a in by_round.get(r, []) if a["task"] == task}
            fig.add_bar(
                name=task, legendgroup=task, showlegend=(r == last),
                x=devices, y=[rows[d]["active_thread_percentage"] if d in rows else None for d in devices],
                text=[f"{task}<br>{rows[d]['active_thread_percentage']}% · B={rows[d]['batch_size']}" if d in rows else "" for d in devices],
                textposition="inside", marker_color=_color(t_i), visible=(r == last),
                hovertemplate="%{x}<br>%{text}<extra></extra>",
            )
            traces_of_round[r].append(len(fig.data) - 1)
    n = len(fig.data)
    if len(round_indices) > 1:
        buttons = []
        for r in round_indices:
            visible = [False] * n
            for i in traces_of_round[r]:
                visible[i] = True
            buttons.append(dict(label=f"round {r}", method="update", args=[{"visible": visible}]))
        fig.update_layout(updatemenus=[dict(buttons=buttons, active=len(round_indices) - 1, x=1.0, xanchor="right", y=1.18)])
    fig.add_hline(y=100, line_dash="dash", line_color="#d62728", annotation_text="100 % of the device")
    fig.update_layout(
        title="Allocation plan: each task's share of its device (B = batch size)", barmode="stack",
        xaxis_title="device", yaxis_title="share (active thread percentage, %)", **LAYOUT,
    )
    return fig if assignments else _empty(fig, "no round planned yet")


def throughput_per_round(rows: Sequence[Mapping]) -> go.Figure:
    """Measured throughput of each task per round, summed over devices (samples/s).

    Args:
        rows: ``{"round_index", "task", "throughput_sps"}`` per assignment (None skipped).
    """
    totals: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        if r["throughput_sps"] is not None:
            totals[r["task"]][r["round_index"]] += r["throughput_sps"]
    fig = go.Figure()
    for i, task in enumerate(sorted(totals)):
        points = sorted(totals[task].items())
        fig.add_scatter(
            x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers", name=task,
            line=dict(color=_color(i)),
        )
    fig.update_layout(
        title="Throughput per task per round (sum over devices)", xaxis_title="round",
        yaxis_title="throughput (samples/s)", xaxis=dict(dtick=1), **LAYOUT,
    )
    return fig if totals else _empty(fig, "no throughput measured yet")


def timeline(rows: Sequence[Mapping]) -> go.Figure:
    """Gantt chart of every assignment's training span, one lane per device and task.

    Args:
        rows: ``{"device", "task", "round_index", "started_at", "finished_at", "status"}`` with
            timezone-aware datetimes; rows without both timestamps are left out.
    """
    rows = [r for r in rows if r.get("started_at") and r.get("finished_at")]
    tasks = sorted({r["task"] for r in rows})
    fig = go.Figure()
    for i, task in enumerate(tasks):
        mine = [r for r in rows if r["task"] == task]
        fig.add_bar(
            orientation="h", name=task,
            y=[f"{r['device']} · {r['task']}" for r in mine],
            base=[r["started_at"].isoformat() for r in mine],
            x=[(r["finished_at"] - r["started_at"]).total_seconds() * 1000.0 for r in mine],
            marker_color=_color(i),
            customdata=[[r["round_index"], r["status"], (r["finished_at"] - r["started_at"]).total_seconds()] for r in mine],
            hovertemplate="round %{customdata[0]} · %{customdata[1]}<br>%{customdata[2]:.2f} s<extra>%{y}</extra>",
        )
    lanes = sorted({f"{r['device']} · {r['task']}" for r in rows})
    fig.update_layout(
        title="Timeline: each assignment's training span", xaxis=dict(type="date", title="wall-clock time (UTC)"),
        yaxis=dict(categoryorder="array", categoryarray=list(reversed(lanes)), title=""), barmode="overlay",
        **{**LAYOUT, "height": max(260, 40 * len(lanes) + 160),
           "legend": dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1)},
    )
    return fig if rows else _empty(fig, "no assignment has trained yet")


def seconds_since(start: dt.datetime | None, points: Iterable[tuple[dt.datetime, float | None]]) -> list[tuple[float, float]]:
    """``[(seconds since start, value)]`` for points with a value (for accuracy curves)."""
    if start is None:
        return []
    return [((t - start).total_seconds(), v) for t, v in points if v is not None]


def predicted_vs_measured(heldout: Sequence[Mapping]) -> go.Figure:
    """Held-out predicted against measured throughput, log axes, one colour per model, with the
    ``y = x`` line (points on it are perfect predictions).

    Args:
        heldout: ``{"architecture", "mix_size", "measured_sps", "predicted_sps"}`` per task.
    """
    fig = go.Figure()
    if not heldout:
        fig.update_layout(title="Predicted against measured throughput (held-out mixes)", **LAYOUT)
        return _empty(fig, "no held-out predictions")
    models = sorted({h["architecture"] for h in heldout})
    for i, model in enumerate(models):
        mine = [h for h in heldout if h["architecture"] == model]
        fig.add_scatter(
            x=[h["measured_sps"] for h in mine], y=[h["predicted_sps"] for h in mine], mode="markers", name=model,
            marker=dict(color=_color(i), size=7, opacity=0.75),
            customdata=[h["mix_size"] for h in mine],
            hovertemplate="measured %{x:.1f}<br>predicted %{y:.1f}<br>mix of %{customdata}<extra>" + model + "</extra>",
        )
    values = [v for h in heldout for v in (h["measured_sps"], h["predicted_sps"]) if v > 0]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(color="#555", dash="dash"))
    fig.update_layout(
        title="Predicted against measured throughput (held-out mixes)",
        xaxis=dict(type="log", title="measured throughput (samples/s)"),
        yaxis=dict(type="log", title="predicted throughput (samples/s)"), **{**LAYOUT, "height": 480},
    )
    return fig


def error_by_mix_size(metrics: Mapping[str, Mapping]) -> go.Figure:
    """Held-out RMSLE per mix size (number of co-located tasks), one bar group per family.

    Args:
        metrics: ``{family: {"by_mix_size": {"1": rmsle, ...}}}``.
    """
    fig = go.Figure()
    for i, (family, m) in enumerate(metrics.items()):
        sizes = sorted(m.get("by_mix_size", {}), key=int)
        fig.add_bar(name=family, x=[f"{s} task{'s' if s != '1' else ''}" for s in sizes],
                    y=[m["by_mix_size"][s] for s in sizes], marker_color=_color(i))
    fig.update_layout(title="Held-out error by mix size", barmode="group", yaxis_title="RMSLE",
                      xaxis_title="co-located tasks", **LAYOUT)
    return fig if metrics else _empty(fig, "no metrics")


def learning_curve(history: Sequence[Mapping]) -> go.Figure:
    """Held-out RMSLE of successive predictor versions against their training samples: how
    the predictor's error changes as profile samples (sweeps, then FL rounds) accumulate.

    Args:
        history: ``{"version", "training_samples", "heldout_rmsle", "kept_family"}`` per version.
    """
    fig = go.Figure()
    if history:
        fig.add_scatter(
            x=[h["training_samples"] for h in history], y=[h["heldout_rmsle"] for h in history], mode="lines+markers+text",
            text=[f"v{h['version']}" for h in history], textposition="top center", name="kept model",
            customdata=[h["kept_family"] for h in history],
            hovertemplate="%{text}: %{customdata}<br>%{x} samples<br>RMSLE %{y:.4f}<extra></extra>",
        )
    fig.update_layout(title="Predictor error as it learns", xaxis_title="training samples",
                      yaxis_title="held-out RMSLE", **LAYOUT)
    return fig if history else _empty(fig, "no fitted predictor yet")
