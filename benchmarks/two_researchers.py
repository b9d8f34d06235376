"""Issue 24's first paragraph: two researchers launch runs on the same two devices 0.07 s apart.

    python benchmarks/two_researchers.py [--rounds 2] [--backend cpu] [--screenshots docs/screenshots]

On the embedded stack in a fresh ``MTFL_HOME``: two local agents (``gpu-a``, ``gpu-b``; the
``cpu`` backend by default), ``alice`` and ``bob`` each own an experiment of the light template on
both devices, and each launches a ``sharing`` run, bob's 0.07 s after alice's. While a round of
one waits for the other's devices, headless Chromium (``/usr/bin/chromium``) logs in as the
waiting run's owner and takes ``run-queued.png`` (the run page's banner naming the holder) and
``lab-queue.png`` (the queue page) into ``--screenshots`` (default: none taken).

Printed, once both runs end: per round its status, queued seconds (``Round.queue_s``), round
time, and its deadline counted from its start (``deadline_at - started_at``, which must not
include the queued time); whether two runs' training spans ever overlapped on one device; last
``max_queue_s=<the longest wait>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.fl_bench import setup_django  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
FINISHED = ("succeeded", "failed", "cancelled")


def _screenshots(base: str, user: str, password: str, run_id: int, folder: Path) -> None:
    """The waiting run's page and the queue page, as ``user``, while the round waits (no
    database access here: Playwright's sync API runs an event loop in this thread)."""
    from playwright.sync_api import sync_playwright

    folder.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{base}/accounts/login/")
            page.fill("input[name=username]", user)
            page.fill("input[name=password]", password)
            page.click("button[type=submit]")
            page.wait_for_load_state()
            page.goto(f"{base}/runs/{run_id}/")
            page.wait_for_selector("#queue-banner:not([hidden])", timeout=10_000)
            print("run page:", page.inner_text("#queue-banner").strip(), flush=True)
            page.screenshot(path=str(folder / "run-queued.png"), full_page=False)
            page.goto(f"{base}/queue/")
            page.wait_for_selector("#queue-waiting tbody tr[id^=queue-round]", timeout=10_000)
            page.screenshot(path=str(folder / "lab-queue.png"), full_page=True)
        finally:
            browser.close()


def _overlaps(run_ids: list[int]) -> int:
    """Pairs of assignments of different runs on one device whose training spans overlap."""
    from controlplane.experiments.models import Assignment

    spans: dict[int, list[tuple[float, float, int]]] = {}
    for device_id, run_id, start, end in Assignment.objects.filter(
        round__run_id__in=run_ids, started_at__isnull=False, finished_at__isnull=False
    ).values_list("device_id", "round__run_id", "started_at", "finished_at"):
        spans.setdefault(device_id, []).append((start.timestamp(), end.timestamp(), run_id))
    found = 0
    for rows in spans.values():
        for i, (s1, e1, r1) in enumerate(rows):
            found += sum(1 for s2, e2, r2 in rows[i + 1 :] if r1 != r2 and s1 < e2 and s2 < e1)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="FL rounds per run (default 2)")
    parser.add_argument("--backend", default="cpu", help="the agents' backend (default cpu)")
    parser.add_argument("--screenshots", default=None, help="folder for run-queued.png and lab-queue.png")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed for both runs (default 900)")
    parser.add_argument("--home", default=None, help="MTFL_HOME to use (default: a new temporary folder)")
    args = parser.parse_args()
    for name in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "DATABASE_URL"):
        os.environ.pop(name, None)
    setup_django(args.home)

    from django.contrib.auth import get_user_model

    from controlplane.core.stack import LocalStack
    from controlplane.experiments.models import Round, Run
    from controlplane.experiments.services import run_create
    from controlplane.experiments.services.templates import experiment_create_from_template
    from controlplane.fleet.models import Device
    from tests.integration.procs import free_port

    users = {name: f"{name}-pass-123" for name in ("alice", "bob")}
    owners = {name: get_user_model().objects.create_user(name, password=pw) for name, pw in users.items()}
    names = ["gpu-a", "gpu-b"]
    port = free_port()
    with LocalStack(agents=names, backend=args.backend, log=lambda line: None) as stack:
        stack.wait_ready(timeout_s=180)
        stack.start_web(f"127.0.0.1:{port}")
        ids = list(Device.objects.filter(name__in=names).order_by("name").values_list("id", flat=True))
        runs = {}
        experiments = {
            name: experiment_create_from_template(
                template="light", device_ids=ids, owner=owner, name=f"{name}'s light mix", rounds=args.rounds
            )
            for name, owner in owners.items()
        }
        for name, experiment in experiments.items():
            runs[name] = run_create(experiment=experiment, strategy="sharing").id
            time.sleep(0.07)
        run_ids = list(runs.values())
        deadline = time.monotonic() + args.timeout
        shot = args.screenshots is None
        while time.monotonic() < deadline:
            stack.children.check_alive()
            if Run.objects.filter(id__in=run_ids, status__in=FINISHED).count() == len(run_ids):
                break
            waiting = Round.objects.filter(run_id__in=run_ids, status=Round.Status.QUEUED).first()
            if not shot and waiting is not None:
                owner = next(name for name, run_id in runs.items() if run_id == waiting.run_id)
                _screenshots(f"http://127.0.0.1:{port}", owner, users[owner], waiting.run_id, Path(args.screenshots))
                shot = True
            time.sleep(0.2)
        else:
            print(f"the runs did not end within {args.timeout:.0f} s", file=sys.stderr)
            return 1

    print(
        f"{'run':>4} {'owner':<6} {'round':>5} {'status':<10} {'queued s':>9} {'round s':>8} {'deadline from start s':>22}"
    )
    rounds = Round.objects.filter(run_id__in=run_ids).select_related("run__experiment__owner").order_by("started_at")
    for r in rounds:
        from_start = (r.deadline_at - r.started_at).total_seconds() if r.deadline_at and r.started_at else None
        print(
            f"{r.run_id:>4} {r.run.experiment.owner.username:<6} {r.index:>5} {r.status:<10} "
            f"{r.queue_s if r.queue_s is not None else float('nan'):>9.1f} "
            f"{r.round_time_s if r.round_time_s is not None else float('nan'):>8.1f} "
            f"{from_start if from_start is not None else float('nan'):>22.1f}"
        )
    for run in Run.objects.filter(id__in=run_ids).order_by("id"):
        print(f"run {run.id}: {run.status}{' (' + run.error + ')' if run.error else ''}")
    print(f"overlapping training spans of different runs on one device: {_overlaps(run_ids)}")
    print(f"max_queue_s={max((r.queue_s or 0.0) for r in rounds):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
