"""The agent endpoints: what a device agent with no shared disk calls (``/api/agent/``).

Authenticated by ``Authorization: Agent <key>`` only (:mod:`controlplane.api.authentication`);
the rules of what a device may read and write are in
:mod:`controlplane.storage.services.agent_artifacts`.

- ``GET /api/agent/device/``: which device the key belongs to (the agent checks it at start)
  and the largest upload taken (``max_artifact_bytes``).
- ``GET /api/agent/artifacts/<key>``: a global model one of the device's running assignments
  starts from, streamed; ``X-Content-SHA256`` carries its hex SHA-256.
- ``PUT`` (or ``POST``) ``/api/agent/artifacts/<key>``: the weights the device trained for one
  of its assignments, as the raw body (``application/octet-stream``), with ``Content-Length``
  and ``X-Content-SHA256``. 201 with ``{"key", "sha256", "size"}``.
"""

from __future__ import annotations

from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api.authentication import AgentTokenAuthentication, IsDeviceAgent
from controlplane.common.errors import ApplicationError
from controlplane.conf import mtfl_setting
from controlplane.storage.services import agent_artifacts

SHA256_HEADER = "X-Content-SHA256"


class _AgentApi(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsDeviceAgent]
    # The body is streamed by the service; nothing may parse it into memory first.
    parser_classes: list = []


class AgentDeviceApi(_AgentApi):
    """The device this agent token belongs to."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        """The device this agent token belongs to, and the largest upload taken (bytes)."""
        device = request.auth.device
        return Response(
            {"id": device.id, "name": device.name, "max_artifact_bytes": int(mtfl_setting("MAX_ARTIFACT_BYTES"))}
        )


class AgentArtifactApi(_AgentApi):
    """Download a global model / upload trained weights of this device's assignments."""

    @extend_schema(responses={(200, "application/octet-stream"): OpenApiTypes.BINARY})
    def get(self, request: Request, key: str) -> FileResponse:
        """Download a global model (``runs/<run>/tasks/<task>/global/….safetensors``) that an
        assignment of this device's running round starts from; ``X-Content-SHA256`` carries its
        hex SHA-256. Anything else is 404."""
        path, sha256 = agent_artifacts.agent_artifact_for_download(device=request.auth.device, key=key)
        response = FileResponse(open(path, "rb"), content_type="application/octet-stream")  # noqa: SIM115 - closed by Django
        response[SHA256_HEADER] = sha256
        return response

    @extend_schema(
        request={"application/octet-stream": OpenApiTypes.BINARY},
        parameters=[
            OpenApiParameter(
                SHA256_HEADER, str, OpenApiParameter.HEADER, required=True, description="hex SHA-256 of the body"
            )
        ],
        responses={
            201: OpenApiTypes.OBJECT,
            411: OpenApiResponse(description="No Content-Length: the body must declare its size."),
        },
    )
    def put(self, request: Request, key: str) -> Response:
        """Upload the weights this device trained for one of its assignments
        (``runs/<run>/rounds/<round>/<device>/task-<task>.safetensors``) while its round runs:
        the raw safetensors file as the body, with ``Content-Length`` and ``X-Content-SHA256``.
        Refused: 413 above ``MTFL_MAX_ARTIFACT_BYTES``; 400 on a SHA-256 mismatch, a malformed
        safetensors file or tensors unlike the task's model; 409 once the round has closed;
        404 for any other key."""
        raw_length = request.META.get("CONTENT_LENGTH") or ""
        length = int(raw_length) if raw_length.isdigit() else None
        body = request.stream if length else _EmptyBody()
        try:
            sha256, size = agent_artifacts.agent_artifact_upload(
                device=request.auth.device,
                key=key,
                body=body,
                content_length=length,
                sha256=request.headers.get(SHA256_HEADER, ""),
            )
        except ApplicationError:
            if length and length <= int(mtfl_setting("MAX_ARTIFACT_BYTES")):
                _drain(body)
            raise
        return Response({"key": key, "sha256": sha256, "size": size}, status=status.HTTP_201_CREATED)

    post = put


def _drain(body) -> None:
    """Read what is left of a refused upload (the server side of a body the client is still
    sending): a server that closes the connection with unread bytes makes the client see a
    reset instead of the refusal's reason. Bodies over the size limit are not drained (the agent
    checks the limit before sending)."""
    while body.read(agent_artifacts.CHUNK_BYTES):
        pass


class _EmptyBody:
    """A body of no bytes (DRF gives no stream for ``Content-Length: 0``)."""

    def read(self, _n: int = -1) -> bytes:
        return b""
