"""The control plane's Celery app (queue ``control``), configured from Django settings.

Device agents run their own Django-free app (:mod:`workers.agent`) on the same broker; the two
address each other's tasks by the names in :mod:`workers.queues`.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("mtfl-control")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
