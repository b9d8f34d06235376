"""Pure figure builders: plain data in, ``plotly.graph_objects.Figure`` out.

No Django here: views collect rows with selectors and pass dictionaries, so every figure can be
tested and reused (e.g. for a report) without a database.

Every figure stays small whatever the run's size (a figure travels as JSON inside the page, and
plotly.js draws every point it is given): what grows with devices is drawn for at most
:data:`MAX_DEVICES` devices spread evenly over them by name, what grows with rounds is averaged
over consecutive rounds down to :data:`MAX_POINTS` points a line, per-assignment marks (the
timeline, predicted against measured) keep the newest rounds and an even sample, and the title
says so whenever something was left out. A run of 1,000 devices × 3 tasks × 20 rounds stays well
under 2 MB a figure (tests/controlplane/test_scale.py); the API serves every row.
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


MAX_DEVICES = 50
"""Devices drawn in a figure with one mark per device (bars, timeline lanes)."""
MAX_POINTS = 1000
"""Points a line over rounds keeps (consecutive rounds are averaged beyond)."""
MAX_ROUNDS = 20
"""Rounds offered in the allocation plan's menu and drawn on the timeline (the newest)."""
MAX_MARKS = 3000
"""Per-assignment marks a figure draws (timeline bars, scatter points), per trace."""


def spread(items: Sequence, limit: int) -> list:
    """At most ``limit`` of ``items``, evenly spread (first and last kept), in their order."""
    n = len(items)
    if n <= limit:
        return list(items)
    if limit <= 1:
        return list(items[:limit])
    return [items[round(k * (n - 1) / (limit - 1))] for k in range(limit)]


def bucket_means(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> tuple[list[tuple[float, float]], int]:
    """``points`` (sorted by x) averaged over runs of ``k`` consecutive points so that at most
    ``limit`` remain: ``(mean x, mean y)`` per run. Returns the points and ``k`` (1: unchanged)."""
    if len(points) <= limit:
        return list(points), 1
    k = -(-len(points) // limit)
    out = []
    for start in range(0, len(points), k):
        chunk = points[start:start + k]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out, k


def _note(title: str, notes: Sequence[str]) -> str:
    """The title with what was left out under it, as a subtitle line."""
    notes = [n for n in notes if n]
    return f"{title}<br><sup>{'; '.join(notes)}</sup>" if notes else title


def _devices_note(shown: int, total: int) -> str:
    return f"{shown} of {total:,} devices shown, spread evenly by name (the API has them all)" if shown < total else ""


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
    longest = max((len(s["points"]) for s in series), default=0)
    for s in series:
        points = spread(s["points"], MAX_POINTS)
        xs = [p[0] for p in points]
        ys = [p[1] for p in points]
        fig.add_scatter(
            x=xs, y=ys, mode="lines+markers", name=f"{s['strategy']} · {s['task']} (run {s['run']})",
            line=dict(color=_color(strategies.index(s["strategy"])), dash=dashes[tasks.index(s["task"]) % len(dashes)]),
        )
    fig.update_layout(
        title=_note("Test accuracy against wall-clock time",
                    [f"{MAX_POINTS} of up to {longest:,} checkpoints a line, spread evenly" if longest > MAX_POINTS else ""]),
        xaxis_title="seconds since the run started",
        yaxis_title="test accuracy", yaxis_range=[0, 1], **{**LAYOUT, "height": 460},
    )
    return fig if series else _empty(fig, "no run yet")


def allocation_plan(assignments: Sequence[Mapping], *, round_indices: Sequence[int],
                    devices_total: int | None = None) -> go.Figure:
    """The allocation plan of each round: per device, stacked bars of each task's share (%),
    batch sizes as labels, a line at 100 %; a menu switches between rounds (last one shown).

    At most :data:`MAX_DEVICES` devices (spread evenly by name) and the newest
    :data:`MAX_ROUNDS` rounds are drawn; the title says when some were left out.

    Args:
        assignments: ``{"round_index", "device", "task", "active_thread_percentage",
            "batch_size"}`` per assignment.
        round_indices: the rounds to offer, in order.
        devices_total: how many devices the run has, when ``assignments`` were already cut
            down to the devices to draw (default: those in ``assignments``).
    """
    fig = go.Figure()
    tasks = sorted({a["task"] for a in assignments})
    all_devices = sorted({a["device"] for a in assignments})
    devices = spread(all_devices, MAX_DEVICES)
    shown = set(devices)
    offered = list(round_indices)[-MAX_ROUNDS:]
    by_round: dict[int, dict[str, dict[str, Mapping]]] = defaultdict(lambda: defaultdict(dict))
    for a in assignments:
        if a["device"] in shown:
            by_round[a["round_index"]][a["task"]][a["device"]] = a
    traces_of_round: dict[int, list[int]] = {}
    last = offered[-1] if offered else None
    for r in offered:
        traces_of_round[r] = []
        for t_i, task in enumerate(tasks):
            rows = by_round.get(r, {}).get(task, {})
            fig.add_bar(
                name=task, legendgroup=task, showlegend=(r == last),
                x=devices, y=[rows[d]["active_thread_percentage"] if d in rows else None for d in devices],
                text=[f"{task}<br>{rows[d]['active_thread_percentage']}% · B={rows[d]['batch_size']}" if d in rows else "" for d in devices],
                textposition="inside", marker_color=_color(t_i), visible=(r == last),
                hovertemplate="%{x}<br>%{text}<extra></extra>",
            )
            traces_of_round[r].append(len(fig.data) - 1)
    n = len(fig.data)
    if len(offered) > 1:
        buttons = []
        for r in offered:
            visible = [False] * n
            for i in traces_of_round[r]:
                visible[i] = True
            buttons.append(dict(label=f"round {r}", method="update", args=[{"visible": visible}]))
        fig.update_layout(updatemenus=[dict(buttons=buttons, active=len(offered) - 1, x=1.0, xanchor="right", y=1.18)])
    fig.add_hline(y=100, line_dash="dash", line_color="#d62728", annotation_text="100 % of the device")
    notes = [_devices_note(len(devices), max(devices_total or 0, len(all_devices))),
             f"the newest {len(offered)} of {len(round_indices):,} rounds" if len(offered) < len(round_indices) else ""]
    fig.update_layout(
        title=_note("Allocation plan: each task's share of its device (B = batch size)", notes), barmode="stack",
        xaxis_title="device", yaxis_title="share (active thread percentage, %)", **LAYOUT,
    )
    return fig if assignments else _empty(fig, "no round planned yet")


def throughput_per_round(rows: Sequence[Mapping]) -> go.Figure:
    """Measured throughput of each task per round, summed over devices (samples/s).

    Beyond :data:`MAX_POINTS` rounds, consecutive rounds are averaged (the title says over how
    many).

    Args:
        rows: ``{"round_index", "task", "throughput_sps"}`` per assignment (None skipped), or
            already summed per round and task.
    """
    totals: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for r in rows:
        if r["throughput_sps"] is not None:
            totals[r["task"]][r["round_index"]] += r["throughput_sps"]
    fig = go.Figure()
    merged = 1
    for i, task in enumerate(sorted(totals)):
        points, k = bucket_means(sorted(totals[task].items()))
        merged = max(merged, k)
        fig.add_scatter(
            x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers" if k == 1 else "lines",
            name=task, line=dict(color=_color(i)),
        )
    title = _note("Throughput per task per round (sum over devices)",
                  [f"each point the mean of {merged} consecutive rounds" if merged > 1 else ""])
    fig.update_layout(
        title=title, xaxis_title="round", yaxis_title="throughput (samples/s)",
        xaxis=dict(dtick=1) if merged == 1 and max((len(v) for v in totals.values()), default=0) <= 30 else {},
        **LAYOUT,
    )
    return fig if totals else _empty(fig, "no throughput measured yet")


def timeline(rows: Sequence[Mapping], *, devices_total: int | None = None, rounds_total: int | None = None) -> go.Figure:
    """Gantt chart of every assignment's training span, one lane per device and task.

    At most :data:`MAX_DEVICES` devices (spread evenly by name), the newest rounds that fit in
    :data:`MAX_MARKS` bars per task; the title says when some were left out.

    Args:
        rows: ``{"device", "task", "round_index", "started_at", "finished_at", "status"}`` with
            timezone-aware datetimes; rows without both timestamps are left out.
        devices_total, rounds_total: how many the run has, when ``rows`` were already cut down
            (default: those in ``rows``).
    """
    rows = [r for r in rows if r.get("started_at") and r.get("finished_at")]
    all_devices = sorted({r["device"] for r in rows})
    devices = set(spread(all_devices, MAX_DEVICES))
    rows = [r for r in rows if r["device"] in devices]
    all_rounds = sorted({r["round_index"] for r in rows})
    tasks = sorted({r["task"] for r in rows})
    lanes_per_round = max(1, len(devices))
    keep_rounds = all_rounds[-max(1, MAX_MARKS // lanes_per_round):]
    if len(keep_rounds) < len(all_rounds):
        first = keep_rounds[0]
        rows = [r for r in rows if r["round_index"] >= first]
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
    total_rounds = max(rounds_total or 0, len(all_rounds))
    notes = [_devices_note(len(devices), max(devices_total or 0, len(all_devices))),
             f"the newest {len(keep_rounds)} of {total_rounds:,} rounds" if len(keep_rounds) < total_rounds else ""]
    fig.update_layout(
        title=_note("Timeline: each assignment's training span", notes),
        xaxis=dict(type="date", title="wall-clock time (UTC)"),
        yaxis=dict(categoryorder="array", categoryarray=list(reversed(lanes)), title=""), barmode="overlay",
        **{**LAYOUT, "height": max(260, min(40 * len(lanes), 4000) + 160),
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
        mine = spread([h for h in heldout if h["architecture"] == model], MAX_MARKS)
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


def error_by_slice(metrics: Mapping[str, Mapping]) -> go.Figure:
    """Held-out RMSLE by the slice a task ran on (controlplane.planning.predictor.slice_labels:
    on the cpu backend its cores and whether another task's threads share them, under MPS
    whether the shares oversubscribe the device), one bar group per family, slices in order of
    their units.
    Predictors fitted before the breakdown existed have none: the figure says so.

    Args:
        metrics: ``{family: {"by_slice": {"1 unit, alone": rmsle, ...}}}``.
    """
    fig = go.Figure()
    kinds = sorted({k for m in metrics.values() for k in m.get("by_slice", {})},
                   key=lambda k: (int(k.split(" ", 1)[0]) if k[:1].isdigit() else 0, k))
    for i, (family, m) in enumerate(metrics.items()):
        if m.get("by_slice"):
            fig.add_bar(name=family, x=[k for k in kinds if k in m["by_slice"]],
                        y=[m["by_slice"][k] for k in kinds if k in m["by_slice"]], marker_color=_color(i))
    fig.update_layout(title="Held-out error by the slice a task ran on", barmode="group", yaxis_title="RMSLE",
                      xaxis_title="the task's slice", **LAYOUT)
    return fig if kinds else _empty(fig, "no breakdown by slice (fitted before it was recorded)")


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
    # From zero and in whole samples: with one version the axis otherwise spans 125.5 samples.
    fig.update_layout(title="Predictor error as it learns",
                      xaxis=dict(title="training samples", rangemode="tozero", tickformat="d"),
                      yaxis=dict(title="held-out RMSLE", rangemode="tozero"), **LAYOUT)
    return fig if history else _empty(fig, "no fitted predictor yet")


# ------------------------------------------------------------------------------ comparison


def _device_round_metrics(rows: Sequence[Mapping]) -> dict[tuple[str, str, int], dict[str, float | None]]:
    """Per (strategy, device, round): raw ``Σ_i P_ij`` and fair ``Σ_i P_ij / P_ij^alone``
    (Yu et al. 2022, §5), over the device's succeeded assignments; fair is None when a
    ``P_alone`` is missing."""
    groups: dict[tuple[str, str, int], list[Mapping]] = defaultdict(list)
    for r in rows:
        if r.get("throughput_sps") is not None:
            groups[(r["strategy"], r["device"], r["round_index"])].append(r)
    out = {}
    for key, mine in groups.items():
        fair = None
        if all(m.get("standalone_throughput_sps") for m in mine):
            fair = sum(m["throughput_sps"] / m["standalone_throughput_sps"] for m in mine)
        out[key] = {"raw": sum(m["throughput_sps"] for m in mine), "fair": fair}
    return out


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def comparison_speedups(rows: Sequence[Mapping], strategies: Sequence[str]) -> dict[str, dict]:
    """Raw and fair speedups over ``temporal``, inside each device and per round.

    Args:
        rows: ``{"strategy", "device", "round_index", "throughput_sps",
            "standalone_throughput_sps"}`` per assignment of the compared runs.
        strategies: the strategies, in display order.

    Returns:
        ``{"per_device": {metric: {strategy: {device: speedup}}}, "per_round": {metric:
        {strategy: {round: speedup}}}}``, metric ``raw`` or ``fair``: per device, the mean over
        rounds of the device's metric over ``temporal``'s mean on that device; per round, the
        mean over devices of each device's metric in that round over ``temporal``'s on that
        device in the same round. Missing baselines leave the entry out.
    """
    return speedups_from_metrics(_device_round_metrics(rows), strategies)


def speedups_from_metrics(m: Mapping[tuple[str, str, int], Mapping[str, float | None]],
                          strategies: Sequence[str]) -> dict[str, dict]:
    """:func:`comparison_speedups` from the metrics per (strategy, device, round) already
    computed (``{"raw": Σ_i P_ij, "fair": Σ_i P_ij / P_ij^alone or None}``, e.g. summed by the
    database)."""
    devices = sorted({d for _, d, _ in m})
    rounds = sorted({r for _, _, r in m})
    out: dict[str, dict] = {"per_device": {}, "per_round": {}}
    for metric in ("raw", "fair"):
        per_device: dict[str, dict] = {}
        per_round: dict[str, dict] = {}
        for s in strategies:
            per_device[s] = {}
            for d in devices:
                mine = _mean(m.get((s, d, r), {}).get(metric) for r in rounds)
                base = _mean(m.get(("temporal", d, r), {}).get(metric) for r in rounds)
                if mine is not None and base:
                    per_device[s][d] = mine / base
            per_round[s] = {}
            for r in rounds:
                ratios = []
                for d in devices:
                    mine = m.get((s, d, r), {}).get(metric)
                    base = m.get(("temporal", d, r), {}).get(metric)
                    if mine is not None and base:
                        ratios.append(mine / base)
                if ratios:
                    per_round[s][r] = sum(ratios) / len(ratios)
        out["per_device"][metric] = per_device
        out["per_round"][metric] = per_round
    return out


def _metric_menu(fig: go.Figure, traces_of: Mapping[str, list[int]]) -> None:
    """A raw/fair menu showing one metric's traces at a time (raw first)."""
    n = len(fig.data)
    buttons = []
    for metric in ("raw", "fair"):
        visible = [i in traces_of[metric] for i in range(n)]
        buttons.append(dict(label=f"{metric} throughput", method="update", args=[{"visible": visible}]))
    fig.update_layout(updatemenus=[dict(buttons=buttons, active=0, x=1.0, xanchor="right", y=1.18)])


def speedup_per_device(speedups: Mapping[str, dict], strategies: Sequence[str]) -> go.Figure:
    """Speedup over ``temporal`` inside each device (the paper's Fig. 4), raw or fair by menu.

    Args:
        speedups: :func:`comparison_speedups`' result.
        strategies: display order.
    """
    sp = speedups["per_device"]
    all_devices = sorted({d for metric in sp.values() for values in metric.values() for d in values})
    shown = set(spread(all_devices, MAX_DEVICES))
    fig = go.Figure()
    traces_of: dict[str, list[int]] = {"raw": [], "fair": []}
    for metric in ("raw", "fair"):
        for i, s in enumerate(strategies):
            values = sp[metric][s]
            devices = sorted(d for d in values if d in shown)
            fig.add_bar(name=s, x=devices, y=[values[d] for d in devices], marker_color=_color(i),
                        text=[f"{values[d]:.2f}×" for d in devices], textposition="outside",
                        visible=(metric == "raw"), legendgroup=s, showlegend=(metric == "raw"))
            traces_of[metric].append(len(fig.data) - 1)
    _metric_menu(fig, traces_of)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    subtitle = "; ".join(n for n in ("over temporal, mean over rounds", _devices_note(len(shown), len(all_devices))) if n)
    fig.update_layout(title=f"Speedup inside each device<br><sup>{subtitle}</sup>", barmode="group",
                      xaxis_title="device", yaxis_title="speedup (×)", **LAYOUT)
    has_data = any(sp["raw"][s] for s in strategies)
    return fig if has_data else _empty(fig, "no round of the compared runs has finished yet")


def speedup_per_round(speedups: Mapping[str, dict], strategies: Sequence[str]) -> go.Figure:
    """Speedup over ``temporal`` averaged over devices, per round (the paper's Fig. 5).

    Args:
        speedups: :func:`comparison_speedups`' result.
        strategies: display order.
    """
    sp = speedups["per_round"]
    fig = go.Figure()
    traces_of: dict[str, list[int]] = {"raw": [], "fair": []}
    merged = 1
    for metric in ("raw", "fair"):
        for i, s in enumerate(strategies):
            points, k = bucket_means(sorted(sp[metric][s].items()))
            merged = max(merged, k)
            fig.add_scatter(name=s, x=[p[0] for p in points], y=[p[1] for p in points],
                            mode="lines+markers" if k == 1 else "lines",
                            line=dict(color=_color(i)), visible=(metric == "raw"), legendgroup=s,
                            showlegend=(metric == "raw"))
            traces_of[metric].append(len(fig.data) - 1)
    _metric_menu(fig, traces_of)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    subtitle = "over temporal, mean over devices" + (f"; each point the mean of {merged} rounds" if merged > 1 else "")
    rounds = max((len(sp[m][s]) for m in sp for s in strategies), default=0)
    fig.update_layout(title=f"Speedup per round<br><sup>{subtitle}</sup>",
                      xaxis=dict(dtick=1, title="round") if merged == 1 and rounds <= 30 else dict(title="round"),
                      yaxis_title="speedup (×)", **LAYOUT)
    has_data = any(sp["raw"][s] for s in strategies)
    return fig if has_data else _empty(fig, "no round of the compared runs has finished yet")


def round_time_split(rows: Sequence[Mapping], strategies: Sequence[str]) -> go.Figure:
    """Round time split, per strategy and device, into the device's own compute (its first
    trainer's start to its last one's end) and the wait for the slowest device (the rest of the
    round), both the mean over rounds, in seconds.

    Args:
        rows: ``{"strategy", "device", "round_index", "started_at", "finished_at"}`` per
            assignment (datetimes; rows without both are left out).
        strategies: display order.
    """
    spans: dict[tuple[str, int], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r.get("started_at") and r.get("finished_at"):
            spans[(r["strategy"], r["round_index"])][r["device"]].append((r["started_at"], r["finished_at"]))
    compute: dict[tuple[str, str], list[float]] = defaultdict(list)
    waiting: dict[tuple[str, str], list[float]] = defaultdict(list)
    for (strategy, _round), by_device in spans.items():
        start = min(s for v in by_device.values() for s, _ in v)
        end = max(e for v in by_device.values() for _, e in v)
        for device, v in by_device.items():
            own = (max(e for _, e in v) - min(s for s, _ in v)).total_seconds()
            compute[(strategy, device)].append(own)
            waiting[(strategy, device)].append((end - start).total_seconds() - own)
    all_devices = sorted({d for _, d in compute})
    shown = set(spread(all_devices, MAX_DEVICES))
    keys = [(s, d) for s in strategies for d in sorted({d for (s2, d) in compute if s2 == s and d in shown})]
    fig = go.Figure()
    x = [[s for s, _ in keys], [d for _, d in keys]]
    fig.add_bar(name="compute (own tasks)", x=x, y=[_mean(compute[k]) for k in keys], marker_color=PALETTE[0])
    fig.add_bar(name="waiting for the slowest device", x=x, y=[_mean(waiting[k]) for k in keys],
                marker_color=PALETTE[7])
    fig.update_layout(title=_note("Round time per device: compute and waiting (mean over rounds)",
                                  [_devices_note(len(shown), len(all_devices))]), barmode="stack",
                      yaxis_title="seconds",
                      **{**LAYOUT, "height": 440, "margin": dict(l=60, r=20, t=80, b=90),
                         "legend": dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1)})
    return fig if keys else _empty(fig, "no round of the compared runs has finished yet")


def plan_predicted_vs_measured(rows: Sequence[Mapping]) -> go.Figure:
    """Predicted against measured throughput of every planned assignment (``vres_*``), log
    axes, one colour per strategy, with ``y = x``.

    Args:
        rows: ``{"strategy", "device", "task", "round_index", "throughput_sps",
            "predicted_throughput_sps"}``; rows missing either value are left out.
    """
    rows = [r for r in rows if r.get("predicted_throughput_sps") and r.get("throughput_sps")]
    fig = go.Figure()
    strategies = sorted({r["strategy"] for r in rows})
    sampled = False
    for i, s in enumerate(strategies):
        every = [r for r in rows if r["strategy"] == s]
        mine = spread(every, MAX_MARKS)
        sampled = sampled or len(mine) < len(every)
        fig.add_scatter(
            x=[r["throughput_sps"] for r in mine], y=[r["predicted_throughput_sps"] for r in mine], mode="markers",
            name=s, marker=dict(color=_color(i + 3), size=8, opacity=0.8),
            text=[f"{r['task']} on {r['device']}, round {r['round_index']}" for r in mine],
            hovertemplate="%{text}<br>measured %{x:.1f}<br>predicted %{y:.1f}<extra></extra>",
        )
    if rows:
        values = [v for r in rows for v in (r["throughput_sps"], r["predicted_throughput_sps"])]
        lo, hi = min(values) / 1.3, max(values) * 1.3
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(color="#555", dash="dash"))
    fig.update_layout(title=_note("Planned assignments: predicted against measured throughput",
                                  [f"{MAX_MARKS:,} assignments a strategy, spread evenly" if sampled else ""]),
                      xaxis=dict(type="log", title="measured throughput (samples/s)"),
                      yaxis=dict(type="log", title="predicted throughput (samples/s)"), **LAYOUT)
    return fig if rows else _empty(fig, "no planned (vres_*) assignment has finished yet")


def final_accuracy(rows: Sequence[Mapping], strategies: Sequence[str]) -> go.Figure:
    """Final test accuracy of each task's global model, one bar per strategy.

    Args:
        rows: ``{"strategy", "accuracy": {task: accuracy}}`` per compared run.
        strategies: display order.
    """
    by_strategy = {r["strategy"]: r["accuracy"] for r in rows}
    tasks = sorted({t for r in rows for t in r["accuracy"]})
    fig = go.Figure()
    for i, s in enumerate(strategies):
        acc = by_strategy.get(s, {})
        fig.add_bar(name=s, x=tasks, y=[acc.get(t) for t in tasks], marker_color=_color(i),
                    text=[f"{acc[t]:.3f}" if acc.get(t) is not None else "" for t in tasks], textposition="outside")
    fig.update_layout(title="Final test accuracy per task", barmode="group", yaxis=dict(range=[0, 1.05], title="accuracy"),
                      xaxis_title="task", **LAYOUT)
    return fig if tasks else _empty(fig, "no run has finished yet")


def _stride(n: int, limit: int) -> int:
    return max(1, -(-n // limit))


TELEMETRY_DEVICES = 16
"""GPU telemetry lines drawn (devices spread evenly by name beyond)."""
TELEMETRY_POINTS = 12_000
"""Samples drawn in all, shared between the devices shown."""


def gpu_telemetry(series: Sequence[Mapping], *, max_points_per_device: int = 1500) -> go.Figure:
    """Whole-GPU utilisation (top) and memory in use (bottom) of each device over wall-clock
    time, one colour per device, with a gap between rounds; the x axis matches the timeline's.

    Under MPS, NVML cannot attribute work to a client, so these are device totals (per-task
    throughput comes from the trainers).

    Args:
        series: ``{"device", "round_index", "t" (Unix s), "gpu_util_percent" (0-100),
            "memory_used_bytes", "memory_total_bytes" (or None)}`` per device and round.
        max_points_per_device: a long run is thinned to about this many samples per device
            (every k-th sample) so the page stays light; a dropped sample is never interpolated.
            With many devices, :data:`TELEMETRY_POINTS` is shared between the
            :data:`TELEMETRY_DEVICES` drawn (spread evenly by name).
    """
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("GPU utilisation (%)", "GPU memory in use (GiB)"))
    all_devices = sorted({s["device"] for s in series})
    devices = spread(all_devices, TELEMETRY_DEVICES)
    per_device = max(1, min(max_points_per_device, TELEMETRY_POINTS // max(1, len(devices))))
    for i, device in enumerate(devices):
        mine = sorted((s for s in series if s["device"] == device), key=lambda s: s["round_index"])
        step = _stride(sum(len(s["t"]) for s in mine), per_device)
        x: list[str | None] = []
        util: list[float | None] = []
        mem: list[float | None] = []
        for s in mine:
            for k in range(0, len(s["t"]), step):
                x.append(dt.datetime.fromtimestamp(s["t"][k], tz=dt.UTC).isoformat())
                util.append(s["gpu_util_percent"][k])
                mem.append(s["memory_used_bytes"][k] / 2**30)
            x.append(None)
            util.append(None)
            mem.append(None)
        color = _color(i)
        fig.add_scatter(x=x, y=util, name=device, legendgroup=device, mode="lines", line=dict(color=color),
                        row=1, col=1, hovertemplate="%{y:.0f} %<extra>" + device + "</extra>")
        fig.add_scatter(x=x, y=mem, name=device, legendgroup=device, showlegend=False, mode="lines",
                        line=dict(color=color), row=2, col=1, hovertemplate="%{y:.2f} GiB<extra>" + device + "</extra>")
        totals = [s["memory_total_bytes"] for s in mine if s.get("memory_total_bytes")]
        if totals:
            fig.add_hline(y=max(totals) / 2**30, line=dict(color=color, dash="dot", width=1), row=2, col=1)
    fig.update_yaxes(range=[0, 100], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_xaxes(type="date", title_text="wall-clock time (UTC)", row=2, col=1)
    fig.update_layout(title=_note("GPU telemetry (NVML, whole device)", [_devices_note(len(devices), len(all_devices))]),
                      **{**LAYOUT, "height": 460})
    if not any(s["t"] for s in series):
        return _empty(fig, "no GPU telemetry yet: it arrives with each round's results")
    return fig
