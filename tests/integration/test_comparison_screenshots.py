"""Issue 33: a comparison with 3 repeats (and one with 2) on the experiment page, drawn by
plotly.js in Debian's headless Chromium: both clocks of time to accuracy, positive log-scale
intervals, every repeat a point, value labels clear of the whiskers, accuracy curves with bands
and a style per strategy, the "n = 2: interval wide" note. The comparisons are seeded rows
(tests/controlplane/comparison_seed.py) served by Django's live server: no stack is started.

The screenshots go to ``test-artifacts/screenshots/``, or to the folder ``MTFL_SCREENSHOTS``
names: ``MTFL_SCREENSHOTS=docs/screenshots pytest -n 0 tests/integration/test_comparison_screenshots.py``
regenerates the ones in ``docs/screenshots/`` (docs/screenshots/README.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.controlplane.comparison_seed import seed_comparison
from tests.integration.test_browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, _drawn_traces

pytestmark = [pytest.mark.integration, pytest.mark.one_database]

SHOTS = Path(os.environ.get("MTFL_SCREENSHOTS") or ARTIFACTS / "screenshots")
STRATEGIES = ["temporal", "isolation", "sharing", "vres_greedy", "vres_sync"]

FIGURE_SHOTS = {
    "fig-time_to_accuracy": "time-to-accuracy-two-clocks.png",
    "fig-comparison_throughput": "comparison-speedups-3-repeats.png",
    "fig-per_device": "speedup-per-device.png",
    "fig-accuracy_rounds": "accuracy-bands.png",
    "fig-accuracy": "accuracy-bands-wall-clock.png",
    "fig-round_time": "round-time-waiting.png",
    "fig-accuracy_final": "final-accuracy-3-repeats.png",
}
"""Each chart of the 3-repeat comparison and the file its screenshot is saved as."""

SWITCH_CLOCK_JS = """(id) => {
    const gd = document.getElementById(id);
    const button = gd.layout.updatemenus[0].buttons[1];
    return Plotly.update(gd, button.args[0], {...button.args[1], "updatemenus[0].active": 1}).then(() => button.label);
}"""


def _session_cookie(client, user, url: str) -> dict:
    client.force_login(user)
    return {"name": "sessionid", "value": client.cookies["sessionid"].value, "url": url}


def test_a_three_repeat_comparison_is_drawn_with_both_clocks_bands_and_points(
    transactional_db, live_server, make_experiment, client, user
):
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: apt-get install chromium"
    three = make_experiment(name="three repeats", rounds=6)
    seed_comparison(three, STRATEGIES, repeats=3)
    two = make_experiment(
        name="two repeats", rounds=4, devices=list(three.devices.all()), tasks=list(three.tasks.all())
    )
    seed_comparison(two, ["temporal", "sharing", "vres_sync"], repeats=2, seed=7)
    cookie = _session_cookie(client, user, live_server.url)
    SHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []

    # No database access from here on: Playwright's sync API runs an event loop in this thread.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.add_cookies([cookie])
            page = context.new_page()
            page.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
            page.goto(f"{live_server.url}/experiments/{three.id}/")
            report = page.locator("#comparison-report")
            assert "wall-clock from the run's start" in report.inner_text()
            assert "FL round time" in report.inner_text()
            report.screenshot(path=str(SHOTS / "comparison-3-repeats.png"))
            for figure, name in FIGURE_SHOTS.items():
                assert _drawn_traces(page, figure) >= 2, figure
                page.locator(f"#{figure}").screenshot(path=str(SHOTS / name))
            assert page.evaluate(SWITCH_CLOCK_JS, "fig-accuracy") == "FL round time"
            page.wait_for_timeout(500)  # the redraw after the switch
            page.locator("#fig-accuracy").screenshot(path=str(SHOTS / "accuracy-bands-round-clock.png"))

            page.goto(f"{live_server.url}/experiments/{two.id}/")
            assert "n = 2: interval wide" in page.locator("#small-n-note").inner_text()
            page.locator("#comparison-report").screenshot(path=str(SHOTS / "comparison-2-repeats.png"))
            assert _drawn_traces(page, "fig-time_to_accuracy") >= 2
            page.locator("#fig-time_to_accuracy").screenshot(path=str(SHOTS / "time-to-accuracy-2-repeats.png"))
        finally:
            browser.close()
    assert not problems, problems
