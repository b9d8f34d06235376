"""The dashboard in a real browser on the embedded stack: Debian's Chromium driven by Playwright
runs the README's session from the dashboard alone, on the stack's simulated devices: it logs in
through the login page, profiles a device with the profiling form and follows the sweep's page to
its end, fits a predictor with the fit form and follows its page until the held-out error shows,
creates an experiment from the light template with 2 rounds, launches a ``sharing`` run and follows
it to its end on the run page, then compares the baseline with both planners through the
comparison form; it checks that plotly.js actually drew the charts (not only that the pages
answered 200).

Screenshots are kept as test artifacts in ``test-artifacts/browser/`` (git-ignored; or the
folder ``MTFL_TEST_ARTIFACTS`` names). Chromium comes from the system (``.ci/run`` installs
Debian's package); Playwright never downloads a browser here.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from controlplane.core.stack import LocalStack
from controlplane.experiments.models import Comparison, Experiment, Run
from controlplane.profiling.models import Predictor, ProfileSweep
from tests.integration.procs import free_port

pytestmark = [pytest.mark.integration, pytest.mark.one_database]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(os.environ.get("MTFL_TEST_ARTIFACTS") or Path(__file__).resolve().parents[2] / "test-artifacts")
RUN_TIMEOUT_MS = 240_000
STEP_TIMEOUT_MS = 60_000
"""Each click, navigation and expectation: Playwright's 5 s default is too short for a form that
checks a task's model in a child process on a 2-core machine the rest of the suite is loading."""
SWEEP_BUDGET_S = 1800
"""Simulated seconds of profiling (about 15 s of real time idle): enough mixes to fit on."""
COMPARED = ["temporal", "vres_greedy", "vres_sync"]
"""The baseline and the two planners the session compares."""


def _reload_until_compared(page, timeout_s: float) -> None:
    """Reload the experiment page (it does not refresh itself) until its comparison line says
    the comparison and every run of it succeeded."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        badges = [b.strip() for b in page.locator("#comparison-line .badge").all_text_contents()]
        if badges and all(b == "succeeded" for b in badges):
            return
        time.sleep(2)
        page.reload()
    raise AssertionError(f"the comparison did not succeed within {timeout_s:.0f} s: {badges}")


def _wait_served(url: str, stack: LocalStack, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.children.check_alive()
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"the web server did not answer {url} within {timeout_s:.0f} s")


DRAWN_TRACES_JS = """(id) => {
    const gd = document.getElementById(id);
    if (!gd || !gd.querySelector(".main-svg")) return 0;
    let drawn = 0;
    for (const trace of gd.querySelectorAll(".main-svg g.trace")) {
        const marks = [...trace.querySelectorAll("path")].filter((p) => (p.getAttribute("d") || "").length > 2);
        if (marks.length) drawn += 1;
    }
    return drawn;
}"""


def _drawn_traces(page, figure_id: str, *, at_least: int = 1, timeout_ms: float = 15_000) -> int:
    """How many traces plotly.js drew into the figure's SVG with at least one visible mark,
    once there are ``at_least`` (the page redraws a figure when its live data changes)."""
    try:
        page.wait_for_function(f"(id) => ({DRAWN_TRACES_JS})(id) >= {at_least}", arg=figure_id, timeout=timeout_ms)
    except Exception:  # noqa: BLE001 - report what was drawn instead of a timeout
        pass
    return page.evaluate(DRAWN_TRACES_JS, figure_id)


def test_a_researcher_runs_an_experiment_from_the_browser(child_env, monkeypatch):
    from playwright.sync_api import expect, sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)"
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_RESULT_BACKEND", raising=False)
    get_user_model().objects.create_user("ada", password="ada-pass-123")
    shots = ARTIFACTS / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    names = ["web-a", "web-b"]
    base = f"http://127.0.0.1:{free_port()}"
    problems: list[str] = []

    with LocalStack(agents=names, backend="simulated", log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=120)
        stack.start_web(base.removeprefix("http://"))
        _wait_served(f"{base}/accounts/login/", stack)

        # No database access from here until the browser is closed: Playwright's sync API runs
        # an event loop in this thread, in which Django refuses synchronous queries.
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(STEP_TIMEOUT_MS)
                expect.set_options(timeout=STEP_TIMEOUT_MS)
                page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
                page.on(
                    "console",
                    lambda msg: (
                        problems.append(f"console: {msg.text}")
                        if msg.type == "error" and not msg.text.startswith("Failed to load resource")
                        else None
                    ),
                )
                # Every script, style sheet, page and the favicon loads, but the one form post
                # refused on purpose below.
                page.on(
                    "response",
                    lambda r: (
                        problems.append(f"{r.status} {r.url}")
                        if r.status >= 400 and not (r.status == 400 and r.url.endswith("/experiments/from-template/"))
                        else None
                    ),
                )

                # Log in through the login page (the dashboard sends an anonymous visitor there).
                page.goto(f"{base}/")
                expect(page).to_have_url(re.compile(r"/accounts/login/"))
                page.fill("input[name=username]", "ada")
                page.fill("input[name=password]", "ada-pass-123")
                page.click("main form button[type=submit]")
                expect(page).to_have_url(f"{base}/")
                expect(page.locator("header .user")).to_contain_text("ada")

                # The new forms, for the record (and a look at how they read).
                for url, name in (
                    ("/devices/new/", "device-new"),
                    ("/tasks/new/", "task-new"),
                    ("/experiments/new/", "experiment-new"),
                    ("/predictors/new/", "predictor-new-empty"),
                ):
                    page.goto(base + url)
                    expect(page.locator("main form button[type=submit]")).to_be_visible()
                    page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

                # Profile web-a from the device list's link: the sweep's page follows it to its end.
                page.goto(f"{base}/")
                page.locator("#devices ~ table a.profile-link").first.click()
                expect(page).to_have_url(re.compile(r"/profiling/new/\?device=\d+$"))
                expect(page.locator("#profile-form select[name=device] option:checked")).to_contain_text("web-a")
                page.fill("#profile-form input[name=budget_s]", str(SWEEP_BUDGET_S))
                page.screenshot(path=str(shots / "profile-new.png"), full_page=True)
                page.click("#profile-button")
                expect(page).to_have_url(re.compile(r"/profiling/sweeps/\d+/$"))
                page.screenshot(path=str(shots / "sweep-running.png"), full_page=True)
                expect(page.locator("#sweep-done")).to_be_visible(timeout=RUN_TIMEOUT_MS)
                expect(page.locator("#sweep-state")).to_have_text("succeeded")
                assert page.locator("#sweep-configurations tbody tr").count() > 10
                page.screenshot(path=str(shots / "sweep-done.png"))

                # Fit a predictor on what it measured (the sweep page's link fills in the form).
                page.click("#fit-after-sweep")
                expect(page).to_have_url(re.compile(r"/predictors/new/\?"))
                expect(page.locator("#predictor-form select[name=device_class] option:checked")).to_contain_text(
                    "simulated-titan-v"
                )
                page.screenshot(path=str(shots / "predictor-new.png"), full_page=True)
                page.click("#fit-button")
                expect(page).to_have_url(re.compile(r"/predictors/\d+/$"))
                page.screenshot(path=str(shots / "predictor-fitting.png"), full_page=True)
                expect(page.locator("#predictor-status")).to_have_text("ready", timeout=RUN_TIMEOUT_MS)
                expect(page.locator("#predictor-rmsle")).to_have_text(re.compile(r"^\d+\.\d{4}$"))
                page.screenshot(path=str(shots / "predictor.png"), full_page=True)

                # A template experiment with no device picked: the API's message at the field.
                page.goto(f"{base}/")
                form = page.locator("#new-from-template form")
                form.locator("select[name=template]").select_option("light")
                form.locator("button[type=submit]").click()
                expect(page.locator("#field-devices .error")).to_have_text("devices must list at least one")

                # The light mix on the stack's two devices, two rounds (the README's session).
                form = page.locator("#new-from-template form")
                form.locator("select[name=template]").select_option("light")
                form.locator("select[name=devices]").select_option(label=names)
                form.locator("input[name=name]").fill("browser light")
                form.locator("input[name=rounds]").fill("2")
                page.screenshot(path=str(shots / "index-template-form.png"), full_page=True)
                form.locator("button[type=submit]").click()
                expect(page).to_have_url(re.compile(r"/experiments/\d+/$"))
                expect(page.locator("h1")).to_have_text("browser light")
                experiment_url = page.url

                # Launch a sharing run: the page goes to the run, which the agents train.
                page.locator("#launch-run select[name=strategy]").select_option("sharing")
                expect(page.locator("#launch-run select[name=objective]")).to_be_disabled()
                page.click("#launch-run-button")
                expect(page).to_have_url(re.compile(r"/runs/\d+/$"))
                run_id = int(re.search(r"/runs/(\d+)/$", page.url).group(1))
                expect(page.locator("#run-status")).to_have_text("succeeded", timeout=RUN_TIMEOUT_MS)
                expect(page.locator("#rounds-table tbody tr")).to_have_count(2)
                expect(page.locator("#cancel-run")).to_have_count(0)  # nothing left to cancel

                # plotly.js drew the run's charts: an SVG with marks in every trace it has.
                page.screenshot(path=str(shots / "run.png"), full_page=True)
                drawn = {
                    figure: _drawn_traces(page, figure) for figure in ("fig-plan", "fig-throughput", "fig-timeline")
                }
                assert all(n >= 1 for n in drawn.values()), drawn

                # The experiment page shows the run: its accuracy curve is drawn.
                page.goto(experiment_url)
                page.wait_for_selector("#fig-accuracy .main-svg")
                assert _drawn_traces(page, "fig-accuracy") >= 1
                expect(page.locator("h2:text-is('Runs') + table")).to_contain_text("sharing")
                page.screenshot(path=str(shots / "experiment.png"), full_page=True)

                # The manual plan's table, opened for a look.
                page.locator("#manual-plan summary").click()
                page.locator("#launch-run").screenshot(path=str(shots / "run-form-manual-plan.png"))

                # Compare the baseline with both planners through the comparison form.
                compare = page.locator("#compare-form")
                for box in compare.locator("input[name=strategies]").all():
                    box.set_checked(box.get_attribute("value") in COMPARED)
                compare.locator("input[name=repeats]").fill("1")
                compare.locator("select[name=objective]").select_option("raw")
                page.locator("#comparison").screenshot(path=str(shots / "compare-form.png"))
                page.click("#compare-button")
                expect(page).to_have_url(experiment_url)
                _reload_until_compared(page, timeout_s=RUN_TIMEOUT_MS / 1000 * 2)
                expect(page.locator("#comparison-line .badge")).to_have_count(1 + len(COMPARED))
                expect(page.locator("#comparison-table tbody tr")).to_have_count(len(COMPARED))
                page.screenshot(path=str(shots / "experiment-compared.png"), full_page=True)

                # Its results download as CSV from the page's link.
                experiment_id = int(re.search(r"/experiments/(\d+)/$", experiment_url).group(1))
                with page.expect_download() as download:
                    page.click(f"#experiment-downloads a[href='/experiments/{experiment_id}/assignments.csv']")
                csv_path = shots / "assignments.csv"
                download.value.save_as(csv_path)
            except BaseException:
                page.screenshot(path=str(shots / "failure.png"), full_page=True)
                raise
            finally:
                browser.close()

        stack.children.check_alive()

    print(f"\nbrowser screenshots: {shots}")
    assert problems == [], problems
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("run,strategy,round_index,device,task,status,batch_size,active_thread_percentage")
    # 2 devices × 3 tasks × 2 rounds, for the sharing run and each of the comparison's three.
    assert len(lines) == 1 + 4 * 12
    run = Run.objects.get(id=run_id)
    assert run.status == Run.Status.SUCCEEDED and run.strategy == "sharing" and run.simulated
    experiment = Experiment.objects.get(name="browser light")
    assert experiment.owner.username == "ada" and run.experiment_id == experiment.id
    # What the forms started, through the same services as the CLI.
    sweep = ProfileSweep.objects.get()
    assert sweep.device.name == "web-a" and sweep.budget_s == SWEEP_BUDGET_S and sweep.status == "succeeded"
    predictor = Predictor.objects.get()
    assert predictor.status == "ready" and predictor.backend == "simulated" and predictor.heldout_rmsle is not None
    comparison = Comparison.objects.get(experiment=experiment)
    assert comparison.strategies == COMPARED and comparison.status == Comparison.Status.SUCCEEDED
    compared = list(comparison.runs.order_by("id"))
    assert [r.strategy for r in compared] == COMPARED and all(r.status == Run.Status.SUCCEEDED for r in compared)
    assert all(r.planned for r in compared if r.strategy.startswith("vres_"))
    print(
        f"sweep: {sweep.configs} configurations, {sweep.samples} samples; predictor v{predictor.version} "
        f"{predictor.kept_family}, held-out RMSLE {predictor.heldout_rmsle:.4f} on {predictor.training_samples} samples"
    )
