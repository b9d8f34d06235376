"""Screenshots of a real comparison's experiment page on a running ``mtfl up``: the report
table and its charts, in Debian's headless Chromium (Playwright never downloads a browser).

Usage: ``python benchmarks/comparison_screenshots.py URL USER PASSWORD EXPERIMENT_ID OUTDIR``
(docs/screenshots/README.md gives the session that made the ``cpu-digits-3-repeats-*`` ones).
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"]
FIGURES = ["fig-time_to_accuracy", "fig-accuracy_rounds", "fig-accuracy", "fig-per_device", "fig-round_time"]


def main() -> None:
    """Log in, open the experiment page, and save the report table and each chart as PNGs."""
    if len(sys.argv) != 6:
        sys.exit("usage: comparison_screenshots.py URL USER PASSWORD EXPERIMENT_ID OUTDIR")
    url, user, password, exp, folder = sys.argv[1:6]
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = b.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        page.goto(f"{url}/accounts/login/?next=/experiments/{exp}/")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", password)
        page.click("button[type=submit], input[type=submit]")
        page.wait_for_url(f"**/experiments/{exp}/")
        page.wait_for_timeout(3000)
        page.locator("#comparison-report").screenshot(path=str(out / "table.png"))
        for fig in FIGURES:
            loc = page.locator(f"#{fig}")
            if loc.count():
                loc.screenshot(path=str(out / f"{fig[4:]}.png"))
        print(page.locator("#comparison-report").inner_text()[:3000])
        b.close()


if __name__ == "__main__":
    main()
