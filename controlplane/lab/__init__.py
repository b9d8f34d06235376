"""The shared lab: many researchers' runs on one fleet (Django app ``lab``).

- :mod:`.models` — device leases (which round holds which device) and users' fair-share weights;
- :mod:`.services` — leases, the scheduler (waiting rounds, the scheduling pass), an admin's
  pause and resume of a device and device pools;
- :mod:`.selectors` — the queue as people read it (the queue page, ``GET /api/queue/``,
  ``mtfl queue``);
- :mod:`.receivers` — what the lab does when the experiments app says a round was enqueued or
  released its devices (:mod:`controlplane.experiments.signals`);
- :mod:`.tasks` — the ``LAB_SCHEDULE`` Celery task.

The lab sits above ``experiments`` and ``profiling``: it reads their rounds, runs and sweeps and
dispatches the rounds it grants; neither imports it. Device pools themselves
(:class:`controlplane.fleet.models.DevicePool`) are a property of the fleet's devices.
"""
