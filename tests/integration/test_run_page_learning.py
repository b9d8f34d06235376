"""A short real run on the cpu backend (issue 33, items 3 and 5): three local agents train on the
digits, one holding data of both tasks, one of one task only and one of none. The run page shows
the partition's warnings and each task's test accuracy and training loss per round, with the
values the trainers and the evaluation really produced, drawn by plotly.js in Debian's Chromium
(screenshot in ``test-artifacts/run-learning/``)."""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model

from controlplane.core.demo import run_wait
from controlplane.core.stack import LocalStack
from controlplane.dashboard import run_charts
from controlplane.experiments import services
from controlplane.experiments.models import Assignment, Checkpoint, Run
from controlplane.fleet.models import Device
from tests.integration.procs import free_port
from tests.integration.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _drawn_traces, _wait_served

pytestmark = [pytest.mark.integration, pytest.mark.one_database]

AGENTS = ["lp-a", "lp-b", "lp-c"]


def _run(owner) -> Run:
    devices = {d.name: d for d in Device.objects.filter(name__in=AGENTS)}
    tasks = [
        services.task_create(name=f"mobilenet-{uuid.uuid4().hex[:4]}", architecture="mobilenet_v3_small"),
        services.task_create(name=f"shufflenet-{uuid.uuid4().hex[:4]}", architecture="shufflenet_v2_x1_0"),
    ]
    counts = [
        {"device": devices["lp-a"].id, "task": tasks[0].id, "num_samples": 48},
        {"device": devices["lp-a"].id, "task": tasks[1].id, "num_samples": 48},
        {"device": devices["lp-b"].id, "task": tasks[0].id, "num_samples": 32},
    ]
    experiment = services.experiment_create(
        name=f"learn-{uuid.uuid4().hex[:6]}",
        task_ids=[t.id for t in tasks],
        device_ids=[d.id for d in devices.values()],
        rounds=2,
        partition_rule="explicit",
        sample_counts=counts,
        owner=owner,
    )
    return services.run_create(experiment=experiment, strategy="sharing")


def test_a_real_runs_page_shows_its_learning_curves_and_the_device_left_out(child_env, monkeypatch):
    from playwright.sync_api import sync_playwright

    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    owner = get_user_model().objects.create_user("lena", password="lena-pass-123")
    shots = ARTIFACTS / "run-learning"
    shots.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{free_port()}"

    with LocalStack(agents=AGENTS, log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        run = run_wait(_run(owner), timeout_s=600)
        stack.children.check_alive()
        assert run.status == Run.Status.SUCCEEDED, run.error

        # lp-c trained nothing and was sent nothing; lp-b trained its one task
        trained = set(Assignment.objects.filter(round__run=run).values_list("device__name", "task__name", "status"))
        tasks = sorted(run.experiment.tasks.values_list("name", flat=True))
        assert {(d, t) for d, t, _ in trained} == {("lp-a", tasks[0]), ("lp-a", tasks[1]), ("lp-b", tasks[0])}
        assert {s for _, _, s in trained} == {"succeeded"}
        holders = sorted(Device.objects.filter(name__in=["lp-a", "lp-b"]).values_list("id", flat=True))
        assert [r.participants for r in run.rounds.order_by("index")] == [holders, holders]  # lp-c never leased
        idle = "lp-c holds no data of any task: it is left out of training in every round"
        assert idle in run.warnings
        assert f"lp-b holds 0 samples of {tasks[1]}: it trains {tasks[0]} only" in run.warnings
        # real values: every round's checkpoint evaluated, every task's training loss measured
        rows = run_charts.run_learning(run)
        assert {(r["rounds_done"], r["task"]) for r in rows} == {(n, t) for n in range(3) for t in tasks}
        assert all(0.0 <= r["test_accuracy"] <= 1.0 and r["test_loss"] > 0 for r in rows)
        assert all(r["train_loss"] > 0 for r in rows if r["rounds_done"] > 0)
        losses = dict(
            Assignment.objects.filter(round__run=run, round__index=0, device__name="lp-a").values_list(
                "task__name", "train_loss"
            )
        )
        assert losses and all(v > 0 for v in losses.values())
        accuracy = {
            (c.round.index + 1 if c.round else 0, c.task.name): c.test_accuracy
            for c in Checkpoint.objects.filter(run=run).select_related("round", "task")
        }

        stack.start_web(base.removeprefix("http://"))
        _wait_served(f"{base}/accounts/login/", stack)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{base}/accounts/login/")
                page.fill("input[name=username]", "lena")
                page.fill("input[name=password]", "lena-pass-123")
                page.click("main form button[type=submit]")
                page.goto(f"{base}/runs/{run.id}/")
                drawn = _drawn_traces(page, "fig-learning", at_least=3 * len(tasks))
                warnings_text = page.locator("#run-warnings").inner_text()
                page.locator("#learning-numbers summary").click()
                table_text = page.locator("#learning-table").inner_text()
                page.screenshot(path=str(shots / "run.png"), full_page=True)
                page.locator("#learning-card").screenshot(path=str(shots / "learning.png"))
            finally:
                browser.close()

    assert drawn == 3 * len(tasks)  # accuracy, training loss and test loss of each task
    assert idle in warnings_text
    for (rounds_done, task), value in accuracy.items():
        assert f"{value:.3f}" in table_text, (rounds_done, task, value)
