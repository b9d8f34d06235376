"""The garbage collector's settings in a control worker's processes.

A control worker's process holds a large, long-lived heap from its start (Django, the models,
the libraries a round's recording imports), and a round at scale allocates hundreds of
thousands of short-lived containers (3,000 assignments, 1,000 device results and requests).
With CPython's defaults every 70,000 or so of them start a full (generation 2) collection that
walks the whole heap again: in benchmarks/scale_sim.py (1,000 devices) that was a fifth of the
control plane's time per round, and more the longer the worker had run.

:func:`control_worker_gc` moves what start-up left to the collector's permanent generation
(:func:`gc.freeze`, never walked again; with a forking pool the pages it sits on are no longer
written by the collector either) and collects the youngest generation every
:data:`GEN0_THRESHOLD` allocations instead of every 700. Cycles are still collected; memory held
by garbage waits a little longer for it.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 10_000
"""Allocations (less deallocations) of container objects between two collections of the
youngest generation (CPython's default: 700)."""


def control_worker_gc() -> None:
    """Freeze the heap left by start-up out of the collector's generations and collect the
    youngest generation less often (see the module). Idempotent; call it once the process has
    loaded what it keeps (a control worker's process once Django and its tasks are loaded)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, gen1, gen2)
