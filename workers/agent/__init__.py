"""The device agent a GPU host runs: its Celery app and tasks (:mod:`workers.agent.app`), process
lifecycle, and the broker workaround. ``python -m workers.agent`` (or ``mtfl-agent``) starts it.

Its settings from the environment live in :mod:`workers.config`, below every package of
:mod:`workers`: the backends, the artifact store and the data sets read them too.
"""
