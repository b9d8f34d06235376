"""Benchmark: one FL run of 1,000 simulated devices × 3 tasks × 20 rounds through the control plane,
or of a federation of 10,000 devices of which 100 are sampled per round.

    python benchmarks/scale_sim.py [--devices 1000] [--sample N] [--sampling uniform|weighted]
                                   [--rounds 20] [--strategy sharing]
                                   [--database-url URL] [--profile FILE] [--keep]

``--sample N`` sets the experiment's ``clients_per_round`` (partial participation, issue 23
item 2): each round draws N of the devices (seeded, ``--sampling`` uniform by default), plans,
dispatches, records and aggregates those only, and measures ``P_alone`` of the participants
drawn for the first time before their round (a ``measure_standalone`` chord and its
``STANDALONE_RECORDED`` callback, counted in that round's control-plane seconds). Without it
every device trains every round.

What runs, and how the 1,000 devices are driven. A thousand agent processes cannot run on a
2-core machine, so the devices are served *in this process*: every message the control plane
sends goes through the real services and the real message schemas, and a small in-process
broker stands in for Celery and Redis:

- the control plane's side is the production code, unchanged: ``run_create`` → ``RUN_BEGIN``
  (initial models written and evaluated) → ``STANDALONE_RECORDED`` → for each round
  ``ROUND_ENQUEUE`` (plan, assignments saved, one :class:`~workers.protocol.messages.TrainRoundRequest`
  per device) → one ``ROUND_PROGRESS`` per device (what every agent sends when its trainers
  start) → ``ROUND_SETTLE`` (the round settle, every result validated, assignments recorded,
  FedAvg per task, evaluation, checkpoints, metrics, profile samples of the closed loop, the
  next round) and the watchdog's check. Messages are delivered to the control plane's own
  Celery tasks (controlplane/experiments/tasks.py). The one Celery boundary, the ``dispatch``
  module, runs unchanged too: only its ``app`` and ``chord`` are this in-process stand-in, so
  requests cross it as ``model_dump(mode="json")`` and results as JSON text, as through Celery;
- the devices' side is the real :class:`workers.backends.simulated.SimulatedBackend`, one
  instance serving every device with its own :class:`~workers.backends.base.AgentContext`,
  each request validated from JSON as the agent does (``workers.agent.app.train_round``), each
  result dumped to JSON.

Control-plane seconds per round are the wall-clock seconds spent in the control plane's tasks of
a round (``ROUND_ENQUEUE`` with its dispatch, every ``ROUND_PROGRESS``, decoding the results,
``ROUND_SETTLE``, the watchdog's check), garbage collection during them included, not the
devices' work (the simulated backend's own time is printed apart; the process's garbage
collector is set as a control worker's process sets it, controlplane/common/gc_tuning.py) nor Celery's transport, nor
the tasks a round queues to run beside the next round's training (``RUN_RETENTION``, the
retention policy; ``CHECKPOINTS_EVALUATE``): their seconds and rows per round are printed apart. The
database is a throwaway SQLite file (the embedded default) unless ``--database-url`` names
another (e.g. a PostgreSQL database you created and drop afterwards).

The experiment: the light mix (resnet18, mobilenet_v3_large, shufflenet_v2_x1_0) on the digits,
each device holding 50 samples of each task (as CIFAR-10 split over 1,000 devices; the digits'
1,437 training samples are shared between overlapping shards, see :func:`shards_overlap`), run
with a baseline strategy (planned every round; ``vres_*`` plans, made once per run, are timed
by benchmarks/plan_scale.py). The simulated devices return the global weights unchanged
(workers.backends.simulated), so each round's FedAvg averages identical models; the evaluation
of a model that did not change is reused (same SHA-256), and the cost of the evaluations a real
run adds per round is measured and printed apart.

It then builds the dashboard's figures of the run (run page, its live JSON, the experiment page)
and prints the largest one's JSON size.

Database rows written per round are the rows every ``INSERT``, ``UPDATE`` and ``DELETE`` of the
control plane's tasks of the round changed (the cursor's row count, through a Django execute
wrapper). The pages a researcher opens are rendered too (the run page, its live JSON, the
experiment page, the index with its device list, the API's device list and the run's rounds),
and their sizes printed beside the figures'.

Targets: issue 7, item 6 (1,000 devices, every one trained): ≤ 1.0 control-plane seconds per
round on 2 cores, ≤ 0.6 s since issue 30 (0.543 s before issues 22 to 24); issue 23, item 3 (``--devices 10000 --sample 100``): ≤ 0.5 s per round; both:
every figure and page ≤ 2 MB. Last lines: ``largest_figure_bytes=<bytes>``, then
``control_plane_s_per_round=<seconds>``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LIGHT = ["resnet18", "mobilenet_v3_large", "shufflenet_v2_x1_0"]
SHARD_SAMPLES = 50
TARGET_S = 0.6
TARGET_SAMPLED_S = 0.5
TARGET_BYTES = 2_000_000
BESIDE_THE_ROUNDS = ("run_retention", "checkpoints_evaluate")
"""Control tasks of a round that run beside the next round's training (the control worker runs
two tasks at a time), printed apart from the control plane's seconds per round."""


class Clock:
    """Seconds accumulated per label, and per round for the control plane; and the seconds the
    garbage collector took (gen 2 collections of a process holding many objects are long)."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = collections.defaultdict(float)
        self.control_by_round: dict[int, float] = collections.defaultdict(float)
        self.gc_s = [0.0, 0.0, 0.0]
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)

        self.in_control = False
        self.gc_control_s = 0.0
        self.round_stack: list[int | None] = []
        self.label_stack: list[str] = []
        self.rows_by_label: dict[str, int] = collections.defaultdict(int)
        self.rows_by_round: dict[int, int] = collections.defaultdict(int)
        self.statements_by_round: dict[int, int] = collections.defaultdict(int)
        # (round, "INSERT table") -> [statements, rows]: where a round's rows go.
        self.writes_by_table: dict[tuple[int, str], list[int]] = collections.defaultdict(lambda: [0, 0])

    def count_writes(self, execute, sql, params, many, context):
        """A Django execute wrapper: rows changed by the control plane's writes, per round, and
        per task label (those of tasks that belong to no round, e.g. the retention policy run
        beside the next round, are counted there only)."""
        result = execute(sql, params, many, context)
        if sql.lstrip()[:6].upper() not in ("INSERT", "UPDATE", "DELETE"):
            return result
        rows = max(0, context["cursor"].rowcount)
        if self.label_stack:
            self.rows_by_label[self.label_stack[-1]] += rows
        index = self.round_stack[-1] if self.round_stack else None
        if index is not None:
            self.statements_by_round[index] += 1
            self.rows_by_round[index] += rows
            entry = self.writes_by_table[(index, _statement_target(sql))]
            entry[0] += 1
            entry[1] += rows
        return result

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            took = time.perf_counter() - self._gc_started
            self.gc_s[info["generation"]] += took
            if self.in_control:
                self.gc_control_s += took

    def add(self, label: str, seconds: float, round_index: int | None = None) -> None:
        self.totals[label] += seconds
        if round_index is not None:
            self.control_by_round[round_index] += seconds


@functools.lru_cache(maxsize=1024)
def _statement_target(sql: str) -> str:
    """``"INSERT experiments_assignment"``: a write statement's verb and table (cached: a round
    runs the same progress ``UPDATE`` a thousand times, inside the seconds measured)."""
    words = sql.replace('"', " ").split()
    verb = words[0].upper()
    after = {"INSERT": "INTO", "DELETE": "FROM", "UPDATE": "UPDATE"}[verb]
    table = next((w for k, w in enumerate(words[1:], 1) if words[k - 1].upper() == after), "?")
    return f"{verb} {table}"


class Signature:
    """What ``app.signature`` returns, as far as ``chord`` needs it."""

    def __init__(self, name: str, args=None, kwargs=None, **options) -> None:
        self.name, self.args, self.kwargs, self.options = name, list(args or []), dict(kwargs or {}), options


class InProcessBroker:
    """Stands in for Celery and Redis at the one Celery boundary of the control plane, the
    ``dispatch`` module (controlplane/experiments/services/dispatch.py), which runs unchanged:
    its ``app`` is replaced by this object (``send_task``, ``signature``, ``backend``,
    ``control``) and its ``chord`` by :meth:`chord`.

    Control-queue messages are delivered to the control plane's own Celery tasks
    (controlplane/experiments/tasks.py, called as Celery would call them), in order; messages
    with a countdown (the watchdogs) once nothing else is queued. Device-queue messages go to
    the simulated devices: each request validated from JSON as the agent does, answered by the
    real :class:`~workers.backends.simulated.SimulatedBackend`, its result echoed with the
    request's attempt and idempotency key (``workers.agent.app.train_round``) and carried as JSON
    text; a device task first sends the round-progress message every agent sends.

    Args:
        devices: ``{name: AgentContext}`` of the simulated devices.
        clock: where the seconds go.
        profiler: a ``cProfile.Profile`` enabled around the control plane's work only, or None.
    """

    def __init__(self, devices, clock: Clock, profiler: cProfile.Profile | None = None) -> None:
        from workers.backends.simulated import SimulatedBackend

        self.devices = devices
        self.simulator = SimulatedBackend(time_scale=0.0)
        self.clock = clock
        self.profiler = profiler
        self.queue: collections.deque = collections.deque()
        self.timers: list = []
        self.results: dict[str, dict] = {}
        self.round_index_of: dict[int, int] = {}
        self._depth = 0
        self._nested = 0.0
        self.control = types.SimpleNamespace(revoke=lambda *a, **k: None)

    # -- the Celery API the dispatch module uses

    def install(self) -> None:
        import controlplane.experiments.tasks  # noqa: F401 - registers the control tasks
        import controlplane.lab.tasks  # noqa: F401 - registers LAB_SCHEDULE
        import controlplane.storage.tasks  # noqa: F401 - registers RUN_RETENTION
        from controlplane.celery import app
        from controlplane.experiments import services
        from controlplane.experiments.services import dispatch, standalone

        self.tasks = app.tasks
        dispatch.app = self
        dispatch.chord = self.chord
        # Round 0 starts inside standalone_record: time every round_enqueue on its own, whoever calls it.
        original = standalone.round_enqueue

        def timed_round_enqueue(*, run_id: int, index: int):
            return self._control("round_enqueue", original, run_id=run_id, index=index, round_index=index)

        standalone.round_enqueue = timed_round_enqueue  # standalone_record calls it there
        services.round_enqueue = timed_round_enqueue  # the ROUND_ENQUEUE task calls it here

    @property
    def backend(self):
        """The result backend (this object: it keeps the device tasks' results)."""
        return self

    def signature(self, name: str, args=None, kwargs=None, **options) -> Signature:
        return Signature(name, args, kwargs, **options)

    def send_task(self, name: str, args=None, kwargs=None, countdown=None, **options) -> None:
        message = Signature(name, args, kwargs, **options)
        if countdown:
            self.timers.append(message)
        else:
            self.queue.append(message)

    def chord(self, header):
        def with_callback(callback: Signature) -> None:
            self.queue.append(("chord", list(header), callback))

        return with_callback

    # result backend (dispatch.device_task_states, cancel_device_tasks)
    def get_task_meta(self, task_id: str) -> dict:
        if task_id in self.results:
            return {"status": "SUCCESS", "result": self.results[task_id]}
        return {"status": "PENDING", "result": None}

    def store_result(self, task_id, result, state) -> None:
        pass

    # -- timing

    def _control(self, label: str, fn, *args, round_index: int | None = None, **kwargs):
        """Run a control-plane task, its seconds going to ``label`` (and to the round), less
        those of a task nested in it and timed on its own (round 0's start inside
        ``standalone_record``)."""
        profiling = self.profiler is not None and self._depth == 0 and round_index is not None
        if profiling:  # the rounds only: run_begin's one-off model building would drown them
            self.profiler.enable()
        self._depth += 1
        self.clock.in_control = True
        self.clock.round_stack.append(round_index)
        self.clock.label_stack.append(label)
        nested_before = self._nested
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - t0
            self.clock.round_stack.pop()
            self.clock.label_stack.pop()
            self._depth -= 1
            self.clock.in_control = self._depth > 0
            own = elapsed - (self._nested - nested_before)
            self.clock.add(label, own, round_index)
            if self._depth:
                self._nested += elapsed
            if profiling:
                self.profiler.disable()

    def _device(self, label: str, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.clock.add(label, time.perf_counter() - t0)

    # -- delivery

    def _round_of(self, name: str, args: list, kwargs: dict | None = None) -> int | None:
        from workers.protocol.queues import TaskName

        if name == TaskName.ROUND_ENQUEUE:
            return args[1]
        if name in (TaskName.STANDALONE_RECORDED, TaskName.STANDALONE_WATCHDOG):
            # P_alone of a later round's newly drawn participants belongs to that round; round 0's
            # to the run's beginning, as before partial participation.
            before = (kwargs or {}).get("before_round", 0)
            return before or None
        if name in (TaskName.ROUND_SETTLE,):
            return self.round_index_of.get(args[1])
        if name in (TaskName.ROUND_WATCHDOG, TaskName.ROUND_PROGRESS):
            return self.round_index_of.get(args[0])
        return None

    def _deliver(self, message: Signature) -> None:
        from workers.protocol.queues import TaskName

        if message.name == TaskName.ROUND_ENQUEUE:  # timed by install(), wherever round_enqueue is called
            self.tasks[message.name](*message.args, **message.kwargs)
            return
        label = message.name.rsplit(".", 1)[-1]
        self._control(
            label,
            self.tasks[message.name],
            *message.args,
            **message.kwargs,
            round_index=self._round_of(message.name, message.args, message.kwargs),
        )

    def _device_task(self, sig: Signature) -> str:
        """One device task: the agent's work on a simulated device; returns the result as JSON text."""
        from workers.protocol.messages import DeviceRoundResult, StandaloneRequest, TrainRoundRequest
        from workers.protocol.queues import TaskName

        payload = sig.args[0]
        if sig.name == TaskName.MEASURE_STANDALONE:
            request = StandaloneRequest.model_validate(payload)
            return json.dumps(
                self.simulator.measure_standalone(request, self.devices[request.device]).model_dump(mode="json")
            )
        if sig.name != TaskName.TRAIN_ROUND:
            raise RuntimeError(f"no simulated device task {sig.name}")
        request = TrainRoundRequest.model_validate(payload)
        self.round_index_of[request.round_id] = request.round_index
        self.queue.append(
            Signature(TaskName.ROUND_PROGRESS, [request.round_id, request.device, "started", time.time()])
        )
        result = self.simulator.run_round(request, self.devices[request.device])
        echo = {
            k: getattr(request, k)
            for k in ("attempt", "idempotency_key")
            if k in DeviceRoundResult.model_fields and hasattr(request, k)
        }
        return json.dumps(result.model_copy(update=echo).model_dump(mode="json"))

    def _forget_results(self, round_id: int, header: list) -> None:
        """Drop the device results of a round that has ended from the result backend's stand-in.

        Celery's result backend (Redis) keeps them outside the control worker's heap. Kept in
        this process, a run's results (1,000 per round, tens of objects each) were scanned by
        every gen-2 garbage collection, which lands in the control plane's tasks: a cost that
        grew round after round and that no control worker has. A round still running (a device
        being retried) keeps them: its watchdog may read them.
        """
        from controlplane.experiments.models import Round

        if Round.objects.filter(id=round_id, status=Round.Status.RUNNING).exists():
            return
        for sig in header:
            self.results.pop(sig.options.get("task_id"), None)

    def drain(self, on_round=None) -> None:
        from workers.protocol.queues import TaskName

        idle_checks = 0
        while self.queue or self.timers:
            if not self.queue:  # nothing else to do: the countdowns expire
                idle_checks += 1
                if idle_checks > 1000:
                    raise RuntimeError("the run does not end: only timers are left, again and again")
                self.queue.extend(self.timers)
                self.timers.clear()
            message = self.queue.popleft()
            if isinstance(message, tuple):  # a chord: every device task, then the callback
                _, header, callback = message
                texts = []
                for sig in header:
                    label = "devices: " + sig.name.rsplit(".", 1)[-1]
                    text = self._device(label, self._device_task, sig)
                    if sig.options.get("task_id"):
                        self.results[sig.options["task_id"]] = json.loads(text)
                    texts.append(text)
                # Progress messages reach the control worker while the devices work.
                while (
                    self.queue
                    and isinstance(self.queue[0], Signature)
                    and self.queue[0].name == TaskName.ROUND_PROGRESS
                ):
                    self._deliver(self.queue.popleft())
                results = self._control(
                    "decode results",
                    lambda texts=texts: [json.loads(t) for t in texts],
                    round_index=self._round_of(callback.name, [None, *callback.args], callback.kwargs),
                )
                self._deliver(Signature(callback.name, [results, *callback.args], callback.kwargs))
                if callback.name == TaskName.ROUND_SETTLE:
                    self._forget_results(callback.args[0], header)
                    if on_round:
                        on_round(self.round_index_of.get(callback.args[0]))
                continue
            self._deliver(message)


def setup_django(database_url: str | None) -> Path:
    home = Path(tempfile.mkdtemp(prefix="mtfl-scale-"))
    os.environ["MTFL_HOME"] = str(home)
    os.environ["ARTIFACT_ROOT"] = str(home / "artifacts")
    os.environ["CELERY_BROKER_URL"] = "memory://"  # nothing is sent: dispatch is in-process
    os.environ["CELERY_RESULT_BACKEND"] = "cache+memory://"
    os.environ.pop("MTFL_ENV", None)
    if database_url:
        os.environ["DATABASE_URL"] = database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", interactive=False, verbosity=0)
    return home


def make_devices(count: int, home: Path) -> tuple[list, dict]:
    """``count`` simulated devices registered as their agents would (``device_report``)."""
    from controlplane.fleet.services import device_create, device_report
    from workers.backends.base import AgentContext
    from workers.backends.simulated import SimulatedBackend

    describe = SimulatedBackend(time_scale=0.0).describe()
    devices, contexts = [], {}
    for k in range(count):
        name = f"sim-{k:04d}"
        device_create(name=name, backend="simulated")
        devices.append(
            device_report(inventory={"name": name, "backend": "simulated", "host": "bench", "cores": [0], **describe})
        )
        state = home / "agents" / name
        contexts[name] = AgentContext(
            device=name, cores=[0], state_dir=state, artifact_root=Path(os.environ["ARTIFACT_ROOT"])
        )
    return devices, contexts


def shards_overlap(experiment, samples: int) -> None:
    """Give every device ``samples`` of every task, in overlapping windows of the digits'
    1,437 training samples.

    The digits are too small for 1,000 devices × 3 tasks (an iid split leaves most devices
    without data: a shard holds at least two samples), and CIFAR-10 is not on this machine. The
    simulated devices read no data, and the control plane only carries sizes and offsets, so
    shards that share samples change nothing it does; each shard is as large as CIFAR-10's
    50,000 training samples split over 1,000 devices.
    """
    from controlplane.experiments.models import Shard
    from workers.training.datasets import dataset_info

    train_size = dataset_info("digits").train_size
    devices = list(experiment.devices.order_by("id").values_list("id", flat=True))
    tasks = list(experiment.tasks.order_by("id").values_list("id", flat=True))
    experiment.shards.all().delete()
    Shard.objects.bulk_create(
        Shard(
            experiment=experiment,
            device_id=d,
            task_id=t,
            num_samples=samples,
            offset=(k * samples) % (train_size - samples + 1),
        )
        for k, d in enumerate(devices)
        for t in tasks
    )


def figure_sizes(run, owner) -> dict[str, int]:
    """JSON bytes of every dashboard figure of the run page, its live JSON and the experiment
    page, as the views build them."""
    from controlplane.dashboard import data
    from controlplane.experiments.models import Experiment, Run

    run = Run.objects.select_related("experiment").get(id=run.id)
    sizes: dict[str, int] = {}
    live = data.run_live(run)
    for name, fig in live["figures"].items():
        sizes[f"run page: {name}"] = len(json.dumps(fig))
    sizes["run page: live JSON (all of it)"] = len(json.dumps(live, default=str))
    experiment = Experiment.objects.get(id=run.experiment_id)
    runs = data.experiment_runs(experiment)
    figures = {**data.experiment_figures(experiment, runs), **data.comparison_figures(experiment, runs)["figures"]}
    for name, fig in figures.items():
        sizes[f"experiment page: {name}"] = len(json.dumps(fig))
    return sizes


def page_sizes(run, owner) -> dict[str, tuple[int, int, float]]:
    """``{page: (bytes, SQL queries, seconds)}`` of what a researcher opens, served through
    Django's test client as the web process serves it: the run page, its live JSON, the
    experiment page, the index (experiments, the device list, recent runs), the API's device
    list and the run's rounds."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from rest_framework.authtoken.models import Token

    browser = Client(HTTP_HOST="localhost")
    browser.force_login(owner)
    token, _ = Token.objects.get_or_create(user=owner)
    api = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION=f"Token {token.key}")
    paths = {
        "run page": (browser, f"/runs/{run.id}/"),
        "run page: live JSON": (browser, f"/runs/{run.id}/live/"),
        "experiment page": (browser, f"/experiments/{run.experiment_id}/"),
        "index (device list)": (browser, "/"),
        "API: /api/devices/": (api, "/api/devices/"),
        "API: /api/rounds/?run=": (api, f"/api/rounds/?run={run.id}"),
    }
    out = {}
    for name, (client, path) in paths.items():
        t0 = time.perf_counter()
        with CaptureQueriesContext(connection) as queries:
            response = client.get(path)
        if response.status_code != 200:
            raise RuntimeError(f"{path} answered {response.status_code}")
        out[name] = (len(response.content), len(queries), time.perf_counter() - t0)
    return out


def measure_evaluation(run) -> float:
    """Seconds to evaluate every task's initial global model once: what a real run adds per
    round on top of the figure printed (its models change every round)."""
    from controlplane.experiments import selectors
    from workers.fl.artifacts import get_store
    from workers.training.evaluate import evaluate

    store = get_store()
    t0 = time.perf_counter()
    for ckpt in run.checkpoints.filter(round__isnull=True).select_related("task"):
        evaluate(selectors.task_ref(ckpt.task), store.path(ckpt.artifact_path))
    return time.perf_counter() - t0


def main() -> int:
    from controlplane.planning.strategies import STRATEGY_REGISTRY

    baselines = [s.name for s in STRATEGY_REGISTRY if not s.needs_predictor and not s.takes_plan]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument(
        "--sample",
        type=int,
        default=None,
        help="devices trained per round (the experiment's clients_per_round); default: every device",
    )
    parser.add_argument("--sampling", default="uniform", choices=["uniform", "weighted"])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--strategy",
        default="sharing",
        choices=baselines,
        help="a strategy planned without a predictor (planned every round; the predictor-driven "
        "plans are timed by plan_scale.py)",
    )
    parser.add_argument("--database-url", default=None, help="default: a throwaway SQLite file")
    parser.add_argument("--profile", default=None, help="write a cProfile of the control plane's work here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary MTFL_HOME (database, artifacts)")
    args = parser.parse_args()
    if args.devices < 1:
        parser.error(f"--devices={args.devices} is out of range: at least 1")
    if args.sample is not None and not 1 <= args.sample <= args.devices:
        parser.error(f"--sample={args.sample} is out of range: 1 to --devices ({args.devices})")
    if args.rounds < 1:
        parser.error(f"--rounds={args.rounds} is out of range: at least 1")
    try:
        return run(args)
    finally:
        if not args.keep and "MTFL_HOME" in os.environ and Path(os.environ["MTFL_HOME"]).name.startswith("mtfl-scale-"):
            shutil.rmtree(os.environ["MTFL_HOME"], ignore_errors=True)


def run(args) -> int:

    started = time.perf_counter()
    home = setup_django(args.database_url)
    from django.contrib.auth import get_user_model
    from django.db import connection

    from controlplane.common.gc_tuning import control_worker_gc
    from controlplane.experiments.models import Assignment, Run
    from controlplane.experiments.services import experiment_create, run_create, task_create

    owner = get_user_model().objects.create_user("scale-owner", password="unused-pass")
    t0 = time.perf_counter()
    devices, contexts = make_devices(args.devices, home)
    tasks = [task_create(name=f"scale-{a}", architecture=a, owner=owner) for a in LIGHT]
    experiment = experiment_create(
        name="scale",
        task_ids=[t.id for t in tasks],
        device_ids=[d.id for d in devices],
        rounds=args.rounds,
        partition_rule="iid",
        owner=owner,
    )
    shards_overlap(experiment, SHARD_SAMPLES)
    if args.sample is not None:
        # Set on the model as the API stores it (clients_per_round, client_sampling).
        experiment.clients_per_round = args.sample
        experiment.client_sampling = args.sampling
        experiment.save(update_fields=["clients_per_round", "client_sampling"])
    setup_s = time.perf_counter() - t0
    print(
        f"MTFL_HOME={home} ({connection.vendor}); devices served in this process by the simulated backend, "
        "messages through an in-process stand-in for Celery (see the docstring)"
    )
    sampled = f", {args.sample} sampled per round ({args.sampling})" if args.sample is not None else ""
    print(
        f"{args.devices} simulated devices × {len(tasks)} tasks ({', '.join(LIGHT)}){sampled}, {args.rounds} rounds, "
        f"strategy {args.strategy}: devices registered and experiment created in {setup_s:.1f} s"
    )

    clock = Clock()
    profiler = cProfile.Profile() if args.profile else None
    broker = InProcessBroker(contexts, clock, profiler)
    broker.install()
    # As a control worker's process does once started (controlplane/celery.py): what this
    # process holds now (Django, the control tasks, the simulated devices' side) leaves the
    # collector's generations, and young objects are collected every 10,000 allocations.
    control_worker_gc()
    last = [time.perf_counter()]

    def on_round(index: int) -> None:
        now = time.perf_counter()
        print(
            f"  round {index:2d}: control plane {clock.control_by_round[index]:.3f} s, "
            f"{clock.rows_by_round[index]:,} rows written in {clock.statements_by_round[index]} statements "
            f"(wall {now - last[0]:.1f} s with the devices' work)",
            flush=True,
        )
        last[0] = now

    run = run_create(experiment=experiment, strategy=args.strategy)
    with connection.execute_wrapper(clock.count_writes):
        broker.drain(on_round)
    run.refresh_from_db()
    if profiler:
        profiler.dump_stats(args.profile)
        print(f"cProfile of the control plane's work: {args.profile}")

    rounds = list(run.rounds.order_by("index"))
    assignments = Assignment.objects.filter(round__run=run).count()
    ok = (
        run.status == Run.Status.SUCCEEDED
        and len(rounds) == args.rounds
        and all(r.status == "succeeded" for r in rounds)
    )
    print(
        f"run {run.id}: {run.status}, {len(rounds)} rounds "
        f"({', '.join(sorted({r.status for r in rounds}))}), {assignments} assignments"
        + (f"; error: {run.error}" if run.error else "")
    )

    per_round = [clock.control_by_round[r.index] for r in rounds]
    rows_per_round = [clock.rows_by_round[r.index] for r in rounds]
    participants = [len(r.participants) if r.participants is not None else args.devices for r in rounds]
    totals = clock.totals
    last_index = rounds[-1].index if rounds else None
    print(f"\nrows written in round {last_index}, by statement and table (statements, rows):")
    for (index, target), (statements, rows) in sorted(clock.writes_by_table.items(), key=lambda kv: -kv[1][1]):
        if index == last_index:
            print(f"  {target:<48}{statements:>6}{rows:>8,}")
    print("\nwhere the seconds went (all rounds):")
    for label in sorted(totals, key=totals.get, reverse=True):
        print(f"  {label:<24}{totals[label]:9.2f} s")
    print(
        f"  (garbage collection, included above: {', '.join(f'gen {g} {t:.2f} s' for g, t in enumerate(clock.gc_s))}; "
        f"{clock.gc_control_s:.2f} s of it in the control plane's tasks)"
    )
    evaluation_s = measure_evaluation(run)
    print(
        f"evaluating the {len(tasks)} global models once: {evaluation_s:.2f} s (a real run, whose models "
        f"change, adds this per round; the simulated run's models do not change, so it is reused)"
    )

    sizes = figure_sizes(run, owner)
    print("\ndashboard figures (JSON bytes):")
    for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]):
        print(f"  {name:<44}{size:>12,}")
    figure_only = {k: v for k, v in sizes.items() if "live JSON" not in k}
    largest_name = max(figure_only, key=figure_only.get)
    pages = page_sizes(run, owner)
    print("\npages as served (bytes, queries, seconds):")
    for name, (size, queries, seconds) in sorted(pages.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:<44}{size:>12,}{queries:>6} q{seconds:>8.2f} s")
    largest_page = max(pages, key=lambda k: pages[k][0])

    target = TARGET_SAMPLED_S if args.sample is not None else TARGET_S
    mean = statistics.fmean(per_round) if per_round else float("nan")
    print(
        f"\nparticipants per round: {min(participants):,} to {max(participants):,} of {args.devices:,} devices; "
        f"database rows written per round: mean {statistics.fmean(rows_per_round):,.0f}, max {max(rows_per_round):,}"
    )
    print(
        f"control plane per round: mean {mean:.3f} s, median {statistics.median(per_round):.3f} s, "
        f"max {max(per_round):.3f} s (target ≤ {target:g} s: ratio {mean / target:.2f})"
    )
    beside = [label for label in BESIDE_THE_ROUNDS if label in totals]
    if beside and rounds:
        print(
            "beside the next round (own control tasks, not in the figure above), per round: "
            + "; ".join(
                f"{label} {totals[label] / len(rounds):.3f} s, {clock.rows_by_label[label] / len(rounds):,.0f} rows"
                for label in beside
            )
        )
    print(
        f"largest figure: {largest_name}, {figure_only[largest_name]:,} bytes "
        f"(target ≤ {TARGET_BYTES:,}: ratio {figure_only[largest_name] / TARGET_BYTES:.2f}); largest page: "
        f"{largest_page}, {pages[largest_page][0]:,} bytes"
    )
    print(
        f"set-up (devices registered, experiment created) {setup_s:.1f} s; benchmark took "
        f"{time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.2f}"
    )
    print(f"rows_written_per_round={statistics.fmean(rows_per_round):.0f}")
    print(f"largest_payload_bytes={max(figure_only[largest_name], pages[largest_page][0])}")
    print(f"largest_figure_bytes={figure_only[largest_name]}")
    print(f"control_plane_s_per_round={mean:.3f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
