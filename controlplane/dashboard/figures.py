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
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from controlplane.planning.metrics import CLOCKS
from controlplane.planning.strategies import STRATEGY_REGISTRY, baseline_strategy

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]
"""Plotly's D3 qualitative palette: tasks, models and devices take colours in their order here."""
STRATEGY_PALETTE = [
    "#7f7f7f",
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
]
"""Strategy colours, by position in the strategy registry (the first, the baseline among the
built-ins, in grey: the reference every speedup is taken against)."""
LAYOUT = dict(
    template="plotly_white",
    margin=dict(l=60, r=20, t=50, b=50),
    height=380,
    legend=dict(orientation="h", yanchor="top", y=-0.2, x=0),
)
BAR_LABELS = dict(uniformtext=dict(minsize=9, mode="hide"))
"""Layout for bars labelled with their value: a label that does not fit inside its bar at 9 px is
hidden (its value stays in the hover), so neighbouring labels never run together."""
EMPTY = "mtfl-empty"
"""``layout.meta`` of a figure with nothing to show (:func:`is_empty`)."""


def _empty(fig: go.Figure, message: str) -> go.Figure:
    """Say there is nothing to show instead of drawing empty axes (Plotly defaults a date axis
    without data to the year 2000); :func:`is_empty` recognises the result."""
    fig.add_annotation(
        text=message, showarrow=False, font=dict(size=15, color="#6a737d"), xref="paper", yref="paper", x=0.5, y=0.5
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(meta=EMPTY)
    return fig


def is_empty(fig: go.Figure | Mapping) -> bool:
    """Whether a figure (or its JSON) only says there is nothing to show."""
    layout = fig.layout if isinstance(fig, go.Figure) else fig.get("layout", {})
    return (layout.meta if isinstance(fig, go.Figure) else layout.get("meta")) == EMPTY


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def strategy_color(strategy: str) -> str:
    """The one colour of a strategy in every chart: by its position in the strategy registry
    (plug-ins after the built-ins); a name no longer registered (a removed plug-in's old run)
    gets the colour after the registered ones."""
    names = STRATEGY_REGISTRY.names()
    index = names.index(strategy) if strategy in names else len(names)
    return STRATEGY_PALETTE[index % len(STRATEGY_PALETTE)]


def _value_labels(fig: go.Figure, suffix: str = "", digits: int = 2) -> None:
    """Write each bar's value inside its top end, turned upright so narrow grouped bars keep their
    labels apart (with :data:`BAR_LABELS`, one that does not fit is hidden)."""
    for trace in fig.data:
        if trace.type == "bar":
            trace.update(
                texttemplate=f"%{{y:.{digits}f}}{suffix}",
                textposition="inside",
                textangle=-90,
                insidetextanchor="end",
                insidetextfont=dict(color="white"),
            )


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


def bucket_means(
    points: Sequence[tuple[float, float]], limit: int = MAX_POINTS
) -> tuple[list[tuple[float, float]], int]:
    """``points`` (sorted by x) averaged over runs of ``k`` consecutive points so that at most
    ``limit`` remain: ``(mean x, mean y)`` per run. Returns the points and ``k`` (1: unchanged)."""
    if len(points) <= limit:
        return list(points), 1
    k = -(-len(points) // limit)
    out = []
    for start in range(0, len(points), k):
        chunk = points[start : start + k]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out, k


def _note(title: str, notes: Sequence[str]) -> str:
    """The title with what was left out under it, as a subtitle line."""
    notes = [n for n in notes if n]
    return f"{title}<br><sup>{'; '.join(notes)}</sup>" if notes else title


def _devices_note(shown: int, total: int) -> str:
    return f"{shown} of {total:,} devices shown, spread evenly by name (the API has them all)" if shown < total else ""


def speedup_bars(rows: Sequence[Mapping]) -> go.Figure:
    """Raw and fair throughput speedup over the baseline strategy, one bar pair per strategy in
    the strategy's colour (raw solid, fair hatched).

    Args:
        rows: ``{"label", "strategy", "raw_speedup", "fair_speedup"}`` per bar pair, usually one
            per strategy (speedups may be None when no baseline run has succeeded yet: shown as
            n/a).
    """
    baseline = baseline_strategy().name
    labels = [r["label"] for r in rows]
    colors = [strategy_color(r["strategy"]) for r in rows]
    fig = go.Figure()
    if not rows:
        fig.update_layout(title=f"Speedup over {baseline}", **LAYOUT)
        return _empty(fig, "no succeeded run yet")
    bars = (("raw_speedup", "raw throughput", ""), ("fair_speedup", "fair throughput", "/"))
    for metric, name, pattern in bars:
        # The legend says solid = raw, hatched = fair, in a neutral colour (the bars' own colours
        # are the strategies').
        fig.add_bar(
            name=name,
            x=[None],
            y=[None],
            legendgroup=metric,
            offsetgroup=metric,
            hoverinfo="skip",
            marker=dict(color="#888", pattern=dict(shape=pattern, fgcolor="white")),
        )
    for metric, name, pattern in bars:
        values = [r.get(metric) for r in rows]
        fig.add_bar(
            name=name,
            x=labels,
            y=values,
            marker=dict(color=colors, pattern=dict(shape=pattern, fgcolor="white")),
            showlegend=False,
            legendgroup=metric,
            offsetgroup=metric,
            # upright inside the bar's top, so neighbouring labels never run together; a
            # missing speedup says so above the axis
            text=[f"{v:.2f}×" if v is not None else "n/a" for v in values],
            textangle=-90,
            textposition=["inside" if v is not None else "outside" for v in values],
            insidetextanchor="end",
            insidetextfont=dict(color="white"),
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    fig.update_layout(
        title=_note("Speedup over " + baseline, [f"mean over rounds and devices; dotted line: {baseline} = 1×"]),
        # categories, named: the legend's empty traces come first and would make the axis numeric
        barmode="group",
        yaxis_title="speedup (×)",
        xaxis=dict(type="category", title="strategy"),
        **LAYOUT,
        **BAR_LABELS,
    )
    return fig


def accuracy_labels(series: Sequence[Mapping]) -> list[str]:
    """Each accuracy line's legend label: its strategy, or ``"<algorithm> · <strategy>"``
    (``"fedadam · sharing"``) when the lines differ in FL algorithm (an algorithm comparison on
    one experiment); a line without an ``algorithm`` counts as one of its own."""
    with_algorithm = len({s.get("algorithm") for s in series}) > 1
    return [f"{s.get('algorithm') or '?'} · {s['strategy']}" if with_algorithm else s["strategy"] for s in series]


ROUND_DODGE = 0.07
"""Rounds between neighbouring strategies' points on the accuracy-per-round chart (at most;
less with many strategies, so a round's points stay within half a round of it)."""

LINE_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
"""Line styles of the accuracy curves, one per strategy (label) in order: with
:data:`LINE_SYMBOLS`, two strategies whose curves coincide stay told apart."""
LINE_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star", "cross", "triangle-down"]
"""Marker symbols of the accuracy curves, one per strategy (label) in order."""


def _rgba(color: str, alpha: float) -> str:
    """``#rrggbb`` as ``rgba(r, g, b, alpha)`` (a band's fill)."""
    r, g, b = (int(color[k : k + 2], 16) for k in (1, 3, 5))
    return f"rgba({r}, {g}, {b}, {alpha})"


Clock = tuple[str, str, str, str]
"""An x axis the accuracy curves offer: ``(series key, menu label, axis title, hover format)``."""


def accuracy_over_time(series: Sequence[Mapping]) -> go.Figure:
    """Test accuracy of each task's global model against time, on two clocks chosen by a menu:
    the wall-clock seconds since the run started (``"points"``) and the FL round time, the sum
    of the round times so far (``"round_clock"``, when the series have it). Drawn as
    :func:`accuracy_per_round` draws it (:func:`_accuracy_lines`): one panel per task, one line
    per strategy — the mean over its runs (repeats) round by round, with a band from their
    lowest to highest accuracy and each run as a thin line — and the runs set aside dotted.

    The runs of a strategy are aligned on the round: the mean point of ``r`` rounds done
    averages the accuracies of the runs evaluated after ``r`` rounds, at the mean of their
    times of that round (a run that missed an evaluation is left out of that round only).

    Args:
        series: ``{"strategy", "run", "task", "points": [(seconds, accuracy), ...]}``, optionally
            ``"round_clock": [(seconds of FL rounds, accuracy), ...]``, ``"rounds": [(rounds
            done, accuracy), ...]`` (the same points in the same order: what aligns them; without
            it the ``k``-th point counts as ``k`` rounds done), ``"algorithm"`` (the aggregator
            that made the task's models) and ``"aside"`` (why the run stays out of the mean and
            band, e.g. ``"failed"`` or ``"one-off"``: drawn dotted and labelled with it).
    """
    clocks: list[Clock] = [
        ("points", "wall-clock", "wall-clock seconds since the run started", "%{x:.0f} s wall-clock"),
    ]
    if any(s.get("round_clock") for s in series):
        clocks.append(
            ("round_clock", "FL round time", "seconds of FL rounds (sum of round times)", "%{x:.1f} s of FL rounds")
        )
    return _accuracy_lines(series, clocks=clocks, title="Test accuracy against time")


def accuracy_per_round(series: Sequence[Mapping]) -> go.Figure:
    """Test accuracy of each task's global model against the FL rounds done (0: the initial
    model), drawn as :func:`accuracy_over_time` draws it, so an algorithm that learns more per
    round and one that is only faster per round tell apart side by side.

    Args:
        series: as :func:`accuracy_over_time`, each with ``"rounds": [(rounds done,
            accuracy), ...]``.
    """
    clocks: list[Clock] = [("rounds", "rounds", "rounds done (0: the initial model)", "round %{x:.0f}")]
    return _accuracy_lines(series, clocks=clocks, title="Test accuracy per round")


def _by_round(run: Mapping, key: str) -> dict[int, tuple[float, float]]:
    """A run's points on one clock keyed by rounds done: ``{rounds done: (x, accuracy)}``.

    The rounds done of each point come from the run's ``"rounds"`` line (the points of every
    clock are the same evaluated checkpoints in the same order); a series without it counts its
    points 0, 1, 2, … A later point of the same round replaces an earlier one."""
    line = list(run.get(key) or [])
    done = [int(p[0]) for p in run.get("rounds") or []]
    if len(done) != len(line):
        done = list(range(len(line)))
    return {d: (float(x), float(y)) for d, (x, y) in zip(done, line, strict=True)}


def _across_runs(lines: Sequence[Mapping[int, tuple[float, float]]]) -> list[tuple[float, float, float, float, int]]:
    """The points of ``lines`` (one ``{rounds done: (x, accuracy)}`` per run, :func:`_by_round`)
    taken together round by round: ``(mean x, mean accuracy, lowest, highest, runs)`` per
    rounds-done value any run has, in round order. Aligned on the round, not on the point's
    position, so a run that misses an evaluation leaves that round to the others instead of
    shifting its later rounds onto earlier ones; on the rounds clock ``x`` stays the round, on a
    time clock it is the mean time at which the runs reached that round."""
    out = []
    for d in sorted({d for line in lines for d in line}):
        here = [line[d] for line in lines if d in line]
        ys = [p[1] for p in here]
        out.append((sum(p[0] for p in here) / len(here), sum(ys) / len(ys), min(ys), max(ys), len(here)))
    return out


def _accuracy_group(
    fig: go.Figure, runs: Sequence[Mapping], clock: Clock, *, label: str, task: str, style: dict, row: int
) -> int:
    """One strategy's (label's) curves of one task on one clock, in panel ``row``: the band
    (lowest to highest accuracy over its runs, round by round), each run thin, and the mean over
    runs with the strategy's dash and marker; then the runs set aside (``"aside"``: failed,
    one-off, …) dotted and labelled with why, outside the mean and band. Returns the traces
    added."""
    key, _menu, _axis, x_format = clock
    members = [r for r in runs if not r.get("aside")]
    dx = style.get("dx", 0.0) if key == "rounds" else 0.0
    lines = [{d: (x + dx, y) for d, (x, y) in _by_round(r, key).items()} for r in members]
    shown = spread(_across_runs(lines), MAX_POINTS)
    before = len(fig.data)
    color = style["color"]
    if len(members) > 1:
        for edge, fill in (([p[3] for p in shown], None), ([p[2] for p in shown], "tonexty")):
            fig.add_scatter(
                x=[p[0] for p in shown], y=edge, mode="lines", line=dict(width=0, color=color), fill=fill,
                fillcolor=_rgba(color, 0.15), legendgroup=label, showlegend=False, hoverinfo="skip",
                name=f"{label}: lowest to highest of {len(members)} runs", row=row, col=1,
            )  # fmt: skip
        for r, line in zip(members, lines, strict=True):
            points = spread([line[d] for d in sorted(line)], MAX_POINTS)
            fig.add_scatter(
                x=[p[0] for p in points], y=[p[1] for p in points], mode="lines",
                line=dict(width=1, color=color, dash=style["dash"]), opacity=0.45, legendgroup=label,
                showlegend=False, name=f"{label} run {r['run']}",
                hovertemplate=f"{x_format}: %{{y:.3f}}<extra>{label} · {task} · run {r['run']}</extra>", row=row, col=1,
            )  # fmt: skip
    if members:
        fig.add_scatter(
            x=[p[0] for p in shown],
            y=[p[1] for p in shown],
            customdata=[p[4] for p in shown],
            mode="lines+markers",
            name=label,
            legendgroup=label,
            showlegend=style["legend"],
            line=dict(color=color, dash=style["dash"], width=2.5),
            marker=dict(symbol=style["symbol"], size=style["size"], color=color, line=dict(color="white", width=1)),
            hovertemplate=f"{x_format}: %{{y:.3f}} (mean of %{{customdata}} runs)<extra>{label} · {task} · "
            + (f"run {members[0]['run']}" if len(members) == 1 else "mean")
            + "</extra>",
            row=row,
            col=1,
        )
    asides = [r for r in runs if r.get("aside")]
    _aside_lines(fig, asides, clock, label=label, task=task, style=style, row=row, legend=not members)
    return len(fig.data) - before


def _aside_lines(
    fig: go.Figure, runs: Sequence[Mapping], clock: Clock, *, label: str, task: str, style: dict, row: int, legend: bool
) -> None:
    """The runs of a label that are not in its mean (``"aside"`` says why: ``"failed"``,
    ``"one-off"``, …), each a thin dotted line named ``"<label> run <id> (<why>)"``. When the
    label has no run in its mean (``legend``), the first of them carries the legend entry, so
    the label can still be found and toggled."""
    key, _menu, _axis, x_format = clock
    dx = style.get("dx", 0.0) if key == "rounds" else 0.0
    for k, r in enumerate(runs):
        name = f"{label} run {r['run']} ({r['aside']})"
        line = {d: (x + dx, y) for d, (x, y) in _by_round(r, key).items()}
        points = spread([line[d] for d in sorted(line)], MAX_POINTS)
        fig.add_scatter(
            x=[p[0] for p in points], y=[p[1] for p in points], mode="lines+markers",
            line=dict(width=1, color=style["color"], dash="dot"), marker=dict(size=4, symbol=style["symbol"]),
            opacity=0.5, legendgroup=label, showlegend=style["legend"] and legend and k == 0, name=name,
            hovertemplate=f"{x_format}: %{{y:.3f}}<extra>{label} · {task} · run {r['run']} ({r['aside']})</extra>",
            row=row, col=1,
        )  # fmt: skip


def _accuracy_lines(series: Sequence[Mapping], *, clocks: Sequence[Clock], title: str) -> go.Figure:
    """The accuracy figures' one drawing: one panel per task; per strategy (label,
    :func:`accuracy_labels`) its colour, its own line dash and marker symbol, the mean over its
    runs with a band over them and its runs set aside dotted (:func:`_accuracy_group`); a menu
    over ``clocks`` when there are several; at most :data:`MAX_POINTS` points a line (spread
    evenly)."""
    tasks = sorted({s["task"] for s in series})
    labels = accuracy_labels(series)
    by_label = labels != [s["strategy"] for s in series]
    order = list(dict.fromkeys(labels))
    fig = make_subplots(
        rows=max(1, len(tasks)), cols=1, subplot_titles=tasks or None, vertical_spacing=0.12 / max(1, len(tasks))
    )
    traces_of: list[list[int]] = []
    for clock in clocks:
        mine: list[int] = []
        for row, task in enumerate(tasks, start=1):
            for i, label in enumerate(order):
                runs = [s for s, lab in zip(series, labels, strict=True) if lab == label and s["task"] == task]
                if not runs:
                    continue
                style = {
                    # by strategy: each strategy's own colour in every chart; by algorithm and
                    # strategy: one colour per label, in the order the runs come
                    "color": _color(i) if by_label else strategy_color(runs[0]["strategy"]),
                    "dash": LINE_DASHES[i % len(LINE_DASHES)],
                    "symbol": LINE_SYMBOLS[i % len(LINE_SYMBOLS)],
                    # earlier strategies' markers larger, so a later one drawn on the same point
                    # leaves a rim of the earlier showing
                    "size": max(5, 12 - 2 * i),
                    # on the rounds clock each strategy's points sit side by side around the
                    # round (a dodge), so strategies that reach the same accuracy stay visible
                    "dx": (i - (len(order) - 1) / 2) * min(ROUND_DODGE, 0.5 / max(1, len(order))),
                    "legend": row
                    == min(t for t, name in enumerate(tasks, start=1) if _has(series, labels, label, name)),
                }
                first = len(fig.data)
                mine += range(
                    first, first + _accuracy_group(fig, runs, clock, label=label, task=task, style=style, row=row)
                )
        traces_of.append(mine)
    longest = max((len(s.get(c[0]) or []) for s in series for c in clocks), default=0)
    members = [(lab, s["task"]) for s, lab in zip(series, labels, strict=True) if not s.get("aside")]
    asides = sorted({s["aside"] for s in series if s.get("aside")})
    dodged = clocks[0][0] == "rounds" and len(order) > 1
    notes = [
        "mean over runs, band: lowest to highest, thin: each run" if len(members) > len(set(members)) else "",
        f"dotted: runs outside the mean ({', '.join(asides)})" if asides else "",
        "strategies side by side at each round" if dodged else "",
    ]
    notes.append(f"{MAX_POINTS} of up to {longest:,} checkpoints a line, spread evenly" if longest > MAX_POINTS else "")
    fig.update_yaxes(range=[0, 1], title_text="test accuracy")
    if clocks[0][0] == "rounds" and longest <= 30:
        fig.update_xaxes(dtick=1)  # whole rounds, not 0.5 steps
    notes = [n for n in notes if n]
    fig.update_layout(
        # a line per note: on one line they ran off a half-width card
        title=f"{title}<br><sup>{'<br>'.join(notes)}</sup>" if notes else title,
        **{
            **LAYOUT,
            "margin": dict(l=60, r=20, t=100 + 22 * len(notes), b=50),
            "height": 230 + 260 * max(1, len(tasks)),
            "legend": dict(
                orientation="v", x=1.02, xanchor="left", y=1, yanchor="top", groupclick="togglegroup", tracegroupgap=6
            ),
        },
    )
    _clock_menu(fig, clocks, traces_of, rows=len(tasks))
    return fig if series else _empty(fig, "no run yet")


def _has(series: Sequence[Mapping], labels: Sequence[str], label: str, task: str) -> bool:
    return any(lab == label and s["task"] == task for s, lab in zip(series, labels, strict=True))


def _clock_menu(fig: go.Figure, clocks: Sequence[Clock], traces_of: Sequence[list[int]], *, rows: int) -> None:
    """Show the first clock's traces, with a menu to switch clocks (its axis title on the
    bottom panel) when there are several."""
    bottom = f"xaxis{rows if rows > 1 else ''}"
    for k, mine in enumerate(traces_of):
        for i in mine:
            fig.data[i].visible = k == 0
    fig.layout[bottom].title.text = clocks[0][2]
    if len(clocks) < 2:
        return
    buttons = [
        dict(
            label=clock[1],
            method="update",
            # the height again: plotly.js sizes a responsive figure to its container on update
            args=[
                {"visible": [i in mine for i in range(len(fig.data))]},
                {f"{bottom}.title.text": clock[2], "height": fig.layout.height},
            ],
        )
        for clock, mine in zip(clocks, traces_of, strict=True)
    ]
    fig.update_layout(
        updatemenus=[
            dict(buttons=buttons, active=0, x=1.02, xanchor="left", y=1.04, yanchor="bottom", direction="down")
        ]
    )


def allocation_plan(
    assignments: Sequence[Mapping], *, round_indices: Sequence[int], devices_total: int | None = None
) -> go.Figure:
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
                name=task,
                legendgroup=task,
                showlegend=(r == last),
                x=devices,
                y=[rows[d]["active_thread_percentage"] if d in rows else None for d in devices],
                text=[
                    f"{task}<br>{rows[d]['active_thread_percentage']}% · B={rows[d]['batch_size']}" if d in rows else ""
                    for d in devices
                ],
                textposition="inside",
                marker_color=_color(t_i),
                visible=(r == last),
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
    notes = [
        _devices_note(len(devices), max(devices_total or 0, len(all_devices))),
        f"the newest {len(offered)} of {len(round_indices):,} rounds" if len(offered) < len(round_indices) else "",
    ]
    fig.update_layout(
        title=_note("Allocation plan: each task's share of its device (B = batch size)", notes),
        barmode="stack",
        xaxis_title="device",
        yaxis_title="share (active thread percentage, %)",
        **LAYOUT,
    )
    return fig if assignments else _empty(fig, "no round planned yet")


def throughput_per_round(rows: Sequence[Mapping]) -> go.Figure:
    """Measured throughput of each task per round, summed over the devices that count
    (:mod:`controlplane.planning.metrics`), samples/s.

    Beyond :data:`MAX_POINTS` rounds, consecutive rounds are averaged (the title says over how
    many).

    Args:
        rows: ``{"round_index", "task", "throughput_sps"}``, one per round and task, already
            summed; ``throughput_sps`` None is skipped.
    """
    totals: dict[str, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["throughput_sps"] is not None:
            totals[r["task"]][r["round_index"]] = r["throughput_sps"]
    fig = go.Figure()
    merged = 1
    for i, task in enumerate(sorted(totals)):
        points, k = bucket_means(sorted(totals[task].items()))
        merged = max(merged, k)
        fig.add_scatter(
            x=[p[0] for p in points],
            y=[p[1] for p in points],
            mode="lines+markers" if k == 1 else "lines",
            name=task,
            line=dict(color=_color(i)),
        )
    title = _note(
        "Throughput per task per round (sum over devices)",
        [f"each point the mean of {merged} consecutive rounds" if merged > 1 else ""],
    )
    fig.update_layout(
        title=title,
        xaxis_title="round",
        yaxis_title="throughput (samples/s)",
        xaxis=dict(dtick=1) if merged == 1 and max((len(v) for v in totals.values()), default=0) <= 30 else {},
        **LAYOUT,
    )
    return fig if totals else _empty(fig, "no throughput measured yet")


def timeline(
    rows: Sequence[Mapping], *, devices_total: int | None = None, rounds_total: int | None = None
) -> go.Figure:
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
    keep_rounds = all_rounds[-max(1, MAX_MARKS // lanes_per_round) :]
    if len(keep_rounds) < len(all_rounds):
        first = keep_rounds[0]
        rows = [r for r in rows if r["round_index"] >= first]
    fig = go.Figure()
    for i, task in enumerate(tasks):
        mine = [r for r in rows if r["task"] == task]
        fig.add_bar(
            orientation="h",
            name=task,
            y=[f"{r['device']} · {r['task']}" for r in mine],
            base=[r["started_at"].isoformat() for r in mine],
            x=[(r["finished_at"] - r["started_at"]).total_seconds() * 1000.0 for r in mine],
            marker_color=_color(i),
            customdata=[
                [r["round_index"], r["status"], (r["finished_at"] - r["started_at"]).total_seconds()] for r in mine
            ],
            hovertemplate="round %{customdata[0]} · %{customdata[1]}<br>%{customdata[2]:.2f} s<extra>%{y}</extra>",
        )
    lanes = sorted({f"{r['device']} · {r['task']}" for r in rows})
    total_rounds = max(rounds_total or 0, len(all_rounds))
    notes = [
        _devices_note(len(devices), max(devices_total or 0, len(all_devices))),
        f"the newest {len(keep_rounds)} of {total_rounds:,} rounds" if len(keep_rounds) < total_rounds else "",
    ]
    fig.update_layout(
        title=_note("Timeline: each assignment's training span", notes),
        xaxis=dict(type="date", title="wall-clock time (UTC)"),
        yaxis=dict(categoryorder="array", categoryarray=list(reversed(lanes)), title=""),
        barmode="overlay",
        **{
            **LAYOUT,
            "height": max(260, min(40 * len(lanes), 4000) + 160),
            "legend": dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
        },
    )
    return fig if rows else _empty(fig, "no assignment has trained yet")


def seconds_since(
    start: dt.datetime | None, points: Iterable[tuple[dt.datetime, float | None]]
) -> list[tuple[float, float]]:
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
            x=[h["measured_sps"] for h in mine],
            y=[h["predicted_sps"] for h in mine],
            mode="markers",
            name=model,
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
        yaxis=dict(type="log", title="predicted throughput (samples/s)"),
        **{**LAYOUT, "height": 480},
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
        fig.add_bar(
            name=family,
            x=[f"{s} task{'s' if s != '1' else ''}" for s in sizes],
            y=[m["by_mix_size"][s] for s in sizes],
            marker_color=_color(i),
        )
    fig.update_layout(
        title="Held-out error by mix size",
        barmode="group",
        yaxis_title="RMSLE",
        xaxis_title="co-located tasks",
        **LAYOUT,
    )
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
    kinds = sorted(
        {k for m in metrics.values() for k in m.get("by_slice", {})},
        key=lambda k: (int(k.split(" ", 1)[0]) if k[:1].isdigit() else 0, k),
    )
    for i, (family, m) in enumerate(metrics.items()):
        if m.get("by_slice"):
            fig.add_bar(
                name=family,
                x=[k for k in kinds if k in m["by_slice"]],
                y=[m["by_slice"][k] for k in kinds if k in m["by_slice"]],
                marker_color=_color(i),
            )
    fig.update_layout(
        title="Held-out error by the slice a task ran on",
        barmode="group",
        yaxis_title="RMSLE",
        xaxis_title="the task's slice",
        **LAYOUT,
    )
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
            x=[h["training_samples"] for h in history],
            y=[h["heldout_rmsle"] for h in history],
            mode="lines+markers+text",
            text=[f"v{h['version']}" for h in history],
            textposition="top center",
            name="kept model",
            customdata=[h["kept_family"] for h in history],
            hovertemplate="%{text}: %{customdata}<br>%{x} samples<br>RMSLE %{y:.4f}<extra></extra>",
        )
    # From zero and in whole samples: with one version the axis otherwise spans 125.5 samples.
    fig.update_layout(
        title="Predictor error as it learns",
        xaxis=dict(title="training samples", rangemode="tozero", tickformat="d"),
        yaxis=dict(title="held-out RMSLE", rangemode="tozero"),
        **LAYOUT,
    )
    return fig if history else _empty(fig, "no fitted predictor yet")


# ------------------------------------------------------------------------------ comparison


def _metric_menu(fig: go.Figure, traces_of: Mapping[str, list[int]]) -> None:
    """A raw/fair menu showing one metric's traces at a time (raw first)."""
    n = len(fig.data)
    buttons = []
    for metric in ("raw", "fair"):
        visible = [i in traces_of[metric] for i in range(n)]
        buttons.append(dict(label=f"{metric} throughput", method="update", args=[{"visible": visible}]))
    fig.update_layout(updatemenus=[dict(buttons=buttons, active=0, x=1.0, xanchor="right", y=1.18)])


def _error_bars(means: Sequence[float | None], intervals: Sequence[tuple[float | None, float | None]]) -> dict | None:
    """Plotly's asymmetric ``error_y`` for bars of ``means`` with ``(low, high)`` intervals
    (a bar without one gets none); ``None`` when no bar has an interval."""
    plus: list[float | None] = []
    minus: list[float | None] = []
    for mean, (low, high) in zip(means, intervals, strict=True):
        if mean is None or low is None or high is None:
            plus.append(None)
            minus.append(None)
        else:
            plus.append(high - mean)
            minus.append(mean - low)
    if all(v is None for v in plus):
        return None
    return dict(type="data", symmetric=False, array=plus, arrayminus=minus, color="#333", thickness=1.2, width=4)


def _short(value: float, digits: int) -> str:
    """A bar's value label, kept narrow enough to sit above its bar: no decimals from 100 on,
    one from 10 on, else ``digits`` (``2.12``, ``22.4``, ``108``)."""
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.{min(digits, 1) if abs(value) >= 10 else digits}f}"


def _interval_bars(
    fig: go.Figure,
    *,
    name: str,
    x: Sequence,
    means: Sequence[float | None],
    intervals: Sequence[tuple[float | None, float | None]],
    values: Sequence[Sequence[float]],
    color: str,
    digits: int = 2,
    suffix: str = "",
    value_labels: bool = True,
    **trace,
) -> tuple[list[int], float]:
    """Bars of ``means`` with their intervals as error bars, every repeat's value as a point on
    its bar, and each bar's value written above the top of its whisker (and of its points), so
    no whisker crosses a label. All three traces share the offset group ``name`` (the layout
    needs ``barmode="group"`` and ``scattermode="group"``).

    Args:
        intervals: ``(low, high)`` per bar (``(None, None)``: none).
        values: per bar, its repeats' values.
        value_labels: write each bar's value above it (off where the bars are too narrow for
            their labels: the hover and the table still give them).
        trace: more trace settings for all three (``visible``, ``row``/``col`` of a subplot,
            ``showlegend`` of the bar).

    Returns:
        The indices of the traces added, and the highest point drawn (for the axis range).
    """
    where = {k: trace.pop(k) for k in ("row", "col") if k in trace}
    legend = trace.pop("showlegend", True)
    first = len(fig.data)
    common = dict(offsetgroup=name, alignmentgroup="bars", legendgroup=name, **trace)
    fig.add_bar(
        name=name, x=list(x), y=list(means), error_y=_error_bars(means, intervals), marker_color=color,
        customdata=[len(v) for v in values], showlegend=legend,
        hovertemplate=f"{name}<br>%{{x}}: %{{y:.3g}}{suffix} (mean of %{{customdata}})<extra></extra>",
        **common, **where,
    )  # fmt: skip
    xs = [k for k, v in zip(x, values, strict=True) for _ in v]
    fig.add_scatter(
        x=xs, y=[y for v in values for y in v], mode="markers", name=f"{name}: each repeat", showlegend=False,
        marker=dict(color="#1b1f23", size=6, line=dict(color="white", width=1)),
        hovertemplate=f"{name}<br>%{{x}}: one repeat %{{y:.3g}}{suffix}<extra></extra>", **common, **where,
    )  # fmt: skip
    tops = [
        max([m, *(b for b in (bounds[1],) if b is not None), *v]) if m is not None else None
        for m, bounds, v in zip(means, intervals, values, strict=True)
    ]
    if not value_labels:
        return list(range(first, len(fig.data))), max((t for t in tops if t is not None), default=0.0)
    fig.add_scatter(
        x=list(x), y=tops, mode="text", text=[_short(m, digits) + suffix if m is not None else "" for m in means],
        textposition="top center", textfont=dict(size=9, color="#24292e"), showlegend=False,
        hoverinfo="skip", name=f"{name}: value", cliponaxis=False, **common, **where,
    )  # fmt: skip
    return list(range(first, len(fig.data))), max((t for t in tops if t is not None), default=0.0)


def speedup_per_device(
    speedups: Mapping[str, dict],
    strategies: Sequence[str],
    *,
    intervals: Mapping[str, dict] | None = None,
    values: Mapping[str, dict] | None = None,
    note: str = "",
) -> go.Figure:
    """Speedup over the baseline strategy inside each device (the paper's Fig. 4), raw or fair
    by menu, each strategy in its colour, each repeat a point on its bar, each bar's value above
    its whisker (:func:`_interval_bars`).

    Args:
        speedups: :func:`controlplane.planning.metrics.comparison_speedups`' result (with
            repeats, :func:`~controlplane.planning.metrics.repeated_speedups`' geometric means).
        strategies: display order.
        intervals: the 95 % interval of each speedup over repeats (log scale), shaped as
            ``speedups``: drawn as error bars.
        values: each repeat's speedup, shaped as ``speedups``: drawn as points.
        note: what the subtitle must add (:func:`~controlplane.planning.metrics.small_n_note`).
    """
    sp = speedups["per_device"]
    all_devices = sorted({d for metric in sp.values() for found in metric.values() for d in found})
    shown = set(spread(all_devices, MAX_DEVICES))
    fig = go.Figure()
    traces_of: dict[str, list[int]] = {"raw": [], "fair": []}
    top = 0.0
    for metric in ("raw", "fair"):
        for s in strategies:
            means = sp[metric].get(s, {})
            devices = sorted(d for d in means if d in shown)
            bounds = ((intervals or {}).get("per_device", {}).get(metric, {})).get(s, {})
            points = ((values or {}).get("per_device", {}).get(metric, {})).get(s, {})
            added, high = _interval_bars(
                fig, name=s, x=devices, means=[means[d] for d in devices],
                intervals=[bounds.get(d, (None, None)) for d in devices],
                values=[points.get(d, (means[d],)) for d in devices], color=strategy_color(s), suffix="×",
                visible=(metric == "raw"), showlegend=(metric == "raw"),
            )  # fmt: skip
            traces_of[metric] += added
            top = max(top, high)
    _metric_menu(fig, traces_of)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    baseline = baseline_strategy().name
    subtitle = "; ".join(
        n
        for n in (
            note,
            f"over {baseline}, geometric mean over repeats, 95 % interval, dots: each repeat",
            _devices_note(len(shown), len(all_devices)),
        )
        if n
    )
    fig.update_layout(
        title=f"Speedup inside each device<br><sup>{subtitle}</sup>",
        barmode="group",
        scattermode="group",
        xaxis_title="device",
        yaxis=dict(title="speedup (×)", range=[0, max(top, 1.0) * 1.15]),
        **LAYOUT,
    )
    has_data = any(sp["raw"].get(s) for s in strategies)
    return fig if has_data else _empty(fig, "no round of the compared runs has finished yet")


def speedup_per_round(speedups: Mapping[str, dict], strategies: Sequence[str]) -> go.Figure:
    """Speedup over the baseline strategy averaged over devices, per round (the paper's Fig. 5),
    each strategy in its colour.

    Args:
        speedups: :func:`controlplane.planning.metrics.comparison_speedups`' result.
        strategies: display order.
    """
    sp = speedups["per_round"]
    fig = go.Figure()
    traces_of: dict[str, list[int]] = {"raw": [], "fair": []}
    merged = 1
    for metric in ("raw", "fair"):
        for s in strategies:
            points, k = bucket_means(sorted(sp[metric].get(s, {}).items()))
            merged = max(merged, k)
            fig.add_scatter(
                name=s,
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                mode="lines+markers" if k == 1 else "lines",
                line=dict(color=strategy_color(s)),
                visible=(metric == "raw"),
                legendgroup=s,
                showlegend=(metric == "raw"),
            )
            traces_of[metric].append(len(fig.data) - 1)
    _metric_menu(fig, traces_of)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    subtitle = f"over {baseline_strategy().name}, mean over devices" + (
        f"; each point the mean of {merged} rounds" if merged > 1 else ""
    )
    rounds = max((len(v) for m in sp.values() for v in m.values()), default=0)
    fig.update_layout(
        title=f"Speedup per round<br><sup>{subtitle}</sup>",
        xaxis=dict(dtick=1, title="round") if merged == 1 and rounds <= 30 else dict(title="round"),
        yaxis_title="speedup (×)",
        **LAYOUT,
    )
    has_data = any(sp["raw"].get(s) for s in strategies)
    return fig if has_data else _empty(fig, "no round of the compared runs has finished yet")


def round_time_split(split: Mapping[tuple[str, str], tuple[float, float]], strategies: Sequence[str]) -> go.Figure:
    """Round time split, per strategy and device, into the device's own compute and the wait
    for the slowest device, both the mean over rounds, in seconds.

    Args:
        split: ``{(strategy, device): (compute_s, idle_s)}``
            (:func:`controlplane.planning.metrics.time_split`).
        strategies: display order.
    """
    all_devices = sorted({d for _, d in split})
    shown = set(spread(all_devices, MAX_DEVICES))
    keys = [(s, d) for s in strategies for d in sorted({d for (s2, d) in split if s2 == s and d in shown})]
    fig = go.Figure()
    x = [[s for s, _ in keys], [d for _, d in keys]]
    fig.add_bar(name="compute (own tasks)", x=x, y=[split[k][0] for k in keys], marker_color=PALETTE[0])
    fig.add_bar(name="waiting for the slowest device", x=x, y=[split[k][1] for k in keys], marker_color="#c7c7c7")
    fig.update_layout(
        title=_note(
            "Round time per device: compute and waiting (mean over rounds)",
            [
                "waiting: from the device's end to the round's end (the slowest device waits 0 s)",
                _devices_note(len(shown), len(all_devices)),
            ],
        ),
        barmode="stack",
        yaxis_title="seconds",
        **{
            **LAYOUT,
            "height": 460,
            # the legend under the subtitle, not over it
            "margin": dict(l=60, r=20, t=100, b=90),
            "legend": dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1),
        },
    )
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
    names = STRATEGY_REGISTRY.names()
    strategies = sorted({r["strategy"] for r in rows}, key=lambda n: (names.index(n) if n in names else len(names), n))
    sampled = False
    for s in strategies:
        every = [r for r in rows if r["strategy"] == s]
        mine = spread(every, MAX_MARKS)
        sampled = sampled or len(mine) < len(every)
        fig.add_scatter(
            x=[r["throughput_sps"] for r in mine],
            y=[r["predicted_throughput_sps"] for r in mine],
            mode="markers",
            name=s,
            marker=dict(color=strategy_color(s), size=8, opacity=0.8),
            text=[f"{r['task']} on {r['device']}, round {r['round_index']}" for r in mine],
            hovertemplate="%{text}<br>measured %{x:.1f}<br>predicted %{y:.1f}<extra></extra>",
        )
    if rows:
        values = [v for r in rows for v in (r["throughput_sps"], r["predicted_throughput_sps"])]
        lo, hi = min(values) / 1.3, max(values) * 1.3
        fig.add_scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x", line=dict(color="#555", dash="dash"))
    fig.update_layout(
        title=_note(
            "Planned assignments: predicted against measured throughput",
            [f"{MAX_MARKS:,} assignments a strategy, spread evenly" if sampled else ""],
        ),
        xaxis=dict(type="log", title="measured throughput (samples/s)"),
        yaxis=dict(type="log", title="predicted throughput (samples/s)"),
        **LAYOUT,
    )
    return fig if rows else _empty(fig, "no planned (vres_*) assignment has finished yet")


def final_accuracy(rows: Sequence[Mapping], strategies: Sequence[str]) -> go.Figure:
    """Final test accuracy of each task's global model, one bar per strategy in its colour.

    Args:
        rows: ``{"strategy", "accuracy": {task: accuracy}}`` per compared run.
        strategies: display order.
    """
    by_strategy = {r["strategy"]: r["accuracy"] for r in rows}
    tasks = sorted({t for r in rows for t in r["accuracy"]})
    fig = go.Figure()
    for s in strategies:
        acc = by_strategy.get(s, {})
        fig.add_bar(name=s, x=tasks, y=[acc.get(t) for t in tasks], marker_color=strategy_color(s))
    _value_labels(fig, digits=3)
    fig.update_layout(
        title="Final test accuracy per task",
        barmode="group",
        yaxis=dict(range=[0, 1.05], title="accuracy"),
        xaxis_title="task",
        **LAYOUT,
        **BAR_LABELS,
    )
    return fig if tasks else _empty(fig, "no run has finished yet")


def _estimate_bars(
    fig: go.Figure, strategy: str, x: Sequence, estimates: Sequence[Mapping | None], **bar
) -> tuple[list[int], float]:
    """One strategy's :func:`_interval_bars` from report estimates (``{"mean", "low", "high",
    "n", "values"}``, :meth:`controlplane.planning.metrics.Estimate.as_dict`): the means with
    their 95 % intervals, every repeat a point, the values above the whiskers."""
    digits = bar.pop("digits", 2)
    suffix = bar.pop("suffix", "")
    bar.setdefault("value_labels", True)
    return _interval_bars(
        fig,
        name=strategy,
        x=x,
        means=[e["mean"] if e else None for e in estimates],
        intervals=[(e["low"], e["high"]) if e else (None, None) for e in estimates],
        values=[list(e.get("values") or []) if e else [] for e in estimates],
        color=strategy_color(strategy),
        digits=digits,
        suffix=suffix,
        **bar,
    )


MAX_LABELLED_BARS = 16
"""Bars in a panel up to which each carries its value written above it; beyond, they are too
narrow for a label (the hover and the comparison table give the values)."""


def _repeats_note(report: Mapping, *, log: bool = True) -> str:
    """A comparison chart's subtitle: the small-n note first (where it cannot be cut off), then
    how its bars were taken (``log``: geometric means with log-scale intervals)."""
    repeats = report["repeats"]
    if repeats < 2:
        return "one repeat: no interval"
    mean = "geometric mean" if log else "mean"
    how = f"{mean} of {repeats} repeats, 95 % interval{' (log scale)' if log else ''}, dots: each repeat"
    return "; ".join(n for n in (report.get("small_n_note", ""), how) if n)


def comparison_throughput(report: Mapping) -> go.Figure:
    """Raw, fair and FL throughput speedup of each strategy over the baseline: the geometric mean
    over repeats with its 95 % interval (log scale) as an error bar, every repeat a point, one
    bar group per figure.

    Args:
        report: :func:`controlplane.experiments.selectors.comparison_report`'s result.
    """
    figures_ = [("raw_speedup", "raw"), ("fair_speedup", "fair"), ("fl_speedup", "FL")]
    fig = go.Figure()
    top = 1.0
    for row in report["strategies"]:
        _, high = _estimate_bars(
            fig, row["strategy"], [label for _, label in figures_], [row[f] for f, _ in figures_], suffix="×"
        )
        top = max(top, high)
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    fig.update_layout(
        title=_note(f"Throughput speedup over {report['baseline']}", [_repeats_note(report)]),
        barmode="group",
        scattermode="group",
        xaxis_title="throughput",
        yaxis=dict(title="speedup (×)", range=[0, top * 1.15]),
        **LAYOUT,
    )
    has_data = any(row[f]["mean"] is not None for row in report["strategies"] for f, _ in figures_)
    return fig if has_data else _empty(fig, "no compared run has finished yet")


def time_to_accuracy(report: Mapping) -> go.Figure:
    """Time to each task's target accuracy on both clocks, one panel each — the FL round-time
    clock (the sum of FL round times until the test accuracy first reached the target) and the
    wall clock (from the run's start until that round was aggregated) — per task and strategy:
    the geometric mean over repeats with its 95 % interval (log scale), every repeat a point;
    lower is better.

    Args:
        report: :func:`controlplane.experiments.selectors.comparison_report`'s result.
    """
    targets = {t["task"]: t for t in report["targets"]}
    clocks = report.get("clocks") or CLOCKS
    # one clock per row, each the card's full width: side by side, 5 strategies × 3 tasks left
    # bars too narrow for their values and the task names overlapping
    fig = make_subplots(
        rows=len(clocks), cols=1, subplot_titles=[f"{label} (s)" for label in clocks.values()], vertical_spacing=0.2
    )
    labels: list[str] = []
    tops = [0.0] * len(clocks)
    bars = sum(1 for row in report["strategies"] for t in row["tasks"] if targets[t["task"]]["target"] is not None)
    for row in report["strategies"]:
        tasks = [t for t in row["tasks"] if targets[t["task"]]["target"] is not None]
        labels = [f"{t['task_name']}<br>≥ {targets[t['task']]['target']:.3f}" for t in tasks]
        for k, clock in enumerate(clocks, start=1):
            _, high = _estimate_bars(
                fig, row["strategy"], labels, [t.get(clock) for t in tasks], digits=1,
                row=k, col=1, showlegend=k == 1, value_labels=bars <= MAX_LABELLED_BARS,
            )  # fmt: skip
            tops[k - 1] = max(tops[k - 1], high)
    for k, top in enumerate(tops, start=1):
        fig.update_yaxes(range=[0, max(top, 1e-9) * 1.18], title_text="seconds", row=k, col=1)
    fig.update_layout(
        title=_note("Time to accuracy per task, on two clocks (lower is better)", [_repeats_note(report)]),
        barmode="group",
        scattermode="group",
        **{**LAYOUT, "height": 130 + 300 * len(clocks), "margin": dict(l=60, r=20, t=90, b=50)},
    )
    has_data = any(
        (t.get(clock) or {}).get("mean") is not None
        for row in report["strategies"]
        for t in row["tasks"]
        for clock in clocks
    )
    return fig if has_data and labels else _empty(fig, "no compared run has reached a target yet")


def final_accuracy_estimates(report: Mapping) -> go.Figure:
    """Final test accuracy of each task's global model per strategy: the mean over repeats with
    its 95 % interval (clipped to [0, 1]), every repeat a point (:func:`final_accuracy` draws
    single runs).

    Args:
        report: :func:`controlplane.experiments.selectors.comparison_report`'s result.
    """
    fig = go.Figure()
    for row in report["strategies"]:
        _estimate_bars(
            fig,
            row["strategy"],
            [t["task_name"] for t in row["tasks"]],
            [t["final_accuracy"] for t in row["tasks"]],
            digits=3,
        )
    fig.update_layout(
        title=_note(
            "Final test accuracy per task", [_repeats_note(report, log=False) if report["repeats"] > 1 else ""]
        ),
        barmode="group",
        scattermode="group",
        yaxis=dict(range=[0, 1.12], title="accuracy"),
        xaxis_title="task",
        **LAYOUT,
    )
    has_data = any(t["final_accuracy"]["mean"] is not None for row in report["strategies"] for t in row["tasks"])
    return fig if has_data else _empty(fig, "no run has finished yet")


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

    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=("GPU utilisation (%)", "GPU memory in use (GiB)"),
    )
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
        fig.add_scatter(
            x=x,
            y=util,
            name=device,
            legendgroup=device,
            mode="lines",
            line=dict(color=color),
            row=1,
            col=1,
            hovertemplate="%{y:.0f} %<extra>" + device + "</extra>",
        )
        fig.add_scatter(
            x=x,
            y=mem,
            name=device,
            legendgroup=device,
            showlegend=False,
            mode="lines",
            line=dict(color=color),
            row=2,
            col=1,
            hovertemplate="%{y:.2f} GiB<extra>" + device + "</extra>",
        )
        totals = [s["memory_total_bytes"] for s in mine if s.get("memory_total_bytes")]
        if totals:
            fig.add_hline(y=max(totals) / 2**30, line=dict(color=color, dash="dot", width=1), row=2, col=1)
    fig.update_yaxes(range=[0, 100], row=1, col=1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    fig.update_xaxes(type="date", title_text="wall-clock time (UTC)", row=2, col=1)
    fig.update_layout(
        title=_note("GPU telemetry (NVML, whole device)", [_devices_note(len(devices), len(all_devices))]),
        **{**LAYOUT, "height": 460},
    )
    if not any(s["t"] for s in series):
        return _empty(fig, "no GPU telemetry yet: it arrives with each round's results")
    return fig


UNKNOWN_CLASS_COLOR = "#c9d1d9"
"""The segment of a device whose shard's class histogram is not known (an explicit split saved
before histograms were recorded): its samples are drawn, in grey, without a class."""


def class_colors(num_classes: int) -> list[str]:
    """One colour per class ``0 … num_classes − 1``, the same for class ``k`` in every histogram of
    tasks with up to 10 classes (Plotly's D3 palette, :data:`PALETTE`); more classes take evenly
    spaced colours of the Turbo scale, so neighbouring classes still differ."""
    if num_classes <= len(PALETTE):
        return PALETTE[:num_classes]
    return sample_colorscale("Turbo", [k / (num_classes - 1) for k in range(num_classes)])


MAX_LEGEND_CLASSES = 20
"""Classes listed in a label histogram's legend; with more, the hover names each segment's class."""


def label_histogram(
    task: str, rows: Sequence[Mapping], num_classes: int, *, devices_total: int | None = None
) -> go.Figure:
    """Each device's class histogram of one task's training shard: devices on x (by name), the
    samples stacked by class, one colour per class (:func:`class_colors`); the hover gives the
    device, the class, its samples and the device's total.

    Args:
        task: the task's name (the title).
        rows: ``{"device", "num_samples", "label_counts"}`` per device holding the task's data;
            ``label_counts`` is ``num_classes`` counts, or empty when not known (drawn as one grey
            "class unknown" segment of ``num_samples``).
        num_classes: classes of the task (label ``k`` is "class k").
        devices_total: how many devices hold the task's data, when ``rows`` were already cut
            down to the devices to draw (default: those in ``rows``).

    At most :data:`MAX_DEVICES` devices are drawn, spread evenly by name (the page's table and
    CSV download have them all).
    """
    ordered = sorted(rows, key=lambda r: r["device"])
    shown = spread(ordered, MAX_DEVICES)
    devices = [r["device"] for r in shown]
    totals = [int(r["num_samples"]) for r in shown]
    fig = go.Figure()
    colors = class_colors(num_classes)
    for k in range(num_classes):
        counts = [int(r["label_counts"][k]) if len(r["label_counts"]) > k else 0 for r in shown]
        if not any(counts):
            continue  # a class no device holds adds nothing to draw (its legend entry would mislead)
        fig.add_bar(
            name=f"class {k}",
            x=devices,
            y=counts,
            customdata=totals,
            marker_color=colors[k],
            showlegend=num_classes <= MAX_LEGEND_CLASSES,
            hovertemplate=f"device %{{x}}<br>class {k}: %{{y:,}} samples<br>of %{{customdata:,}} on the device<extra></extra>",
        )
    unknown = [r["num_samples"] if not r["label_counts"] else 0 for r in shown]
    if any(unknown):
        fig.add_bar(
            name="class unknown",
            x=devices,
            y=unknown,
            marker_color=UNKNOWN_CLASS_COLOR,
            hovertemplate="device %{x}<br>%{y:,} samples, classes not recorded<extra></extra>",
        )
    notes = [_devices_note(len(shown), max(devices_total or 0, len(ordered)))]
    if num_classes > MAX_LEGEND_CLASSES:
        notes.append(f"{num_classes} classes: hover a segment for its class")
    fig.update_layout(
        title=_note(f"Label histogram per device: {task}", notes),
        barmode="stack",
        xaxis=dict(title="device", type="category"),
        yaxis=dict(title="training samples"),
        legend_traceorder="normal",
        **LAYOUT,
    )
    return fig if shown else _empty(fig, f"no device holds data of {task}")
