"""Authentication of device agents: ``Authorization: Agent <key>``.

An agent authenticates as its device, never as a user: ``request.user`` stays anonymous (so no
researcher permission can ever pass) and ``request.auth`` is the device's
:class:`~controlplane.fleet.models.DeviceToken`. Only the agent endpoints
(:mod:`controlplane.api.agent_views`) list this class, and they list nothing else: a
researcher's token or session is refused there, and an agent key is refused everywhere else
(the default ``TokenAuthentication`` ignores the ``Agent`` keyword).
"""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission

from controlplane.fleet import selectors as fleet_selectors
from controlplane.fleet import services as fleet_services
from controlplane.fleet.models import DeviceToken

KEYWORD = "Agent"


class AgentTokenAuthentication(BaseAuthentication):
    """``Authorization: Agent <key>`` → ``(AnonymousUser, DeviceToken)``.

    No header, or another scheme: not this class's business (``None``). A malformed header or
    an unknown key: 401.
    """

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD.lower().encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed(f"malformed {KEYWORD} header: use 'Authorization: {KEYWORD} <key>'")
        try:
            key = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("invalid agent token") from None
        token = fleet_selectors.device_token_for_key(key)
        if token is None:
            raise exceptions.AuthenticationFailed("invalid agent token")
        fleet_services.device_token_touch(token=token)
        return AnonymousUser(), token

    def authenticate_header(self, request) -> str:
        return KEYWORD


class AgentTokenScheme(OpenApiAuthenticationExtension):
    """How the OpenAPI schema documents :class:`AgentTokenAuthentication`."""

    target_class = "controlplane.api.authentication.AgentTokenAuthentication"
    name = "agentToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": f"A device agent's token: `{KEYWORD} <key>` (`mtfl device-token DEVICE`).",
        }


class IsDeviceAgent(BasePermission):
    """Only a request authenticated by :class:`AgentTokenAuthentication`."""

    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, DeviceToken)


class CanIssueAgentTokens(BasePermission):
    """Issuing an agent token hands out a device's identity: it reads the global models of every
    experiment that runs on the device and feeds weights into them. So only superusers and users
    granted ``fleet.add_devicetoken`` (the admin, a group) may."""

    message = "issuing agent tokens needs the fleet.add_devicetoken permission (ask a lab admin)"

    def has_permission(self, request, view) -> bool:
        user = request.user
        return bool(user and user.is_authenticated and user.has_perm("fleet.add_devicetoken"))
