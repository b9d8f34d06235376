"""The artifacts' lifecycle (Django app ``storage``): what runs wrote to ``ARTIFACT_ROOT`` and
what is kept of it.

- :mod:`.services.retention` — the retention policy after each round, disk use, deleting runs
  and experiments, garbage collection (``mtfl gc``), the storage overview;
- :mod:`.services.agent_artifacts` — agents' downloads of global models and uploads of their
  trained weights (``/api/agent/artifacts/``);
- :mod:`.exports` — a run's or experiment's rounds and assignments as CSV or JSON;
- :mod:`.tasks` — the ``RUN_RETENTION`` Celery task.

It has no models of its own: it manages the files the experiments app's rows name
(:class:`~controlplane.experiments.models.Checkpoint` stays a run's record). It sits above
``experiments``, which never imports it; the artifact root's layout both read (one folder per
run, free space) is :mod:`controlplane.common.artifact_root`.
"""
