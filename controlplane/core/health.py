"""``GET /healthz``: is the web process up and can it query its database?

For load balancers and the container healthcheck (:mod:`controlplane.core.healthcheck`): no
login, no session, JSON, 200 when the database answers ``SELECT 1`` and 503 (naming the error)
when it does not.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

log = logging.getLogger(__name__)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Return ``{"status": "ok", "database": "ok"}`` (200) or the database error (503)."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        log.warning("healthz: database check failed: %s", exc)
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return JsonResponse({"status": "error", "database": f"{type(exc).__name__}: {first_line}"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})
