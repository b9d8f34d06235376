"""The API's Swagger UI (``/api/docs/``) behind the lab's login.

The schema and the docs page need a logged-in session or a token, as every other page and API
request does (``SPECTACULAR_SETTINGS["SERVE_PERMISSIONS"]``). ``/api/schema/`` refuses an
anonymous request as any API endpoint does (401); the docs page is what a person opens in a
browser, so there an anonymous visitor is sent to the login page instead, like the dashboard's
pages.
"""

from __future__ import annotations

from django.contrib.auth.views import redirect_to_login
from drf_spectacular.views import SpectacularSwaggerView
from rest_framework import exceptions


class SwaggerUiView(SpectacularSwaggerView):
    """drf-spectacular's Swagger UI page, redirecting anonymous visitors to the login page.

    A request with no credentials gets a redirect to ``settings.LOGIN_URL`` with ``?next=`` set
    to the page asked for. A bad or inactive token is still refused (401) rather than redirected:
    logging in would not fix the token the client sent.
    """

    def handle_exception(self, exc: Exception):
        if isinstance(exc, exceptions.NotAuthenticated):
            return redirect_to_login(self.request.get_full_path())
        return super().handle_exception(exc)
