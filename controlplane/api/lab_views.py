"""API views of the shared lab: the queue, an admin's pause and resume of a device, device pools.

Every authenticated user sees the whole queue and every pool (the fleet is shared); pausing a
device and changing pools is for lab admins (staff users): 403 for anyone else.
"""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.permissions import SAFE_METHODS, BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api import serializers as s
from controlplane.api.views import validated_data
from controlplane.fleet.models import Device
from controlplane.lab import selectors as lab_selectors
from controlplane.lab.services import admin as lab_admin


class IsLabAdmin(BasePermission):
    """Staff users only (the lab's admins)."""

    message = "only a lab admin (a staff user) may do this"

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)


class IsLabAdminOrReadOnly(IsLabAdmin):
    """Reads for every authenticated user, writes for lab admins."""

    message = "only a lab admin (a staff user) may change device pools"

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            return bool(request.user and request.user.is_authenticated)
        return super().has_permission(request, view)


class QueueApi(APIView):
    """The shared lab's queue: per device, the run and owner holding it and since when, and
    the rounds waiting for it; the waiting rounds in the order the scheduling policy
    (``MTFL_SCHEDULER_POLICY``) serves them, each with the devices it waits for and its
    estimated start (from predicted round times); the pools. Every user sees the whole queue."""

    @extend_schema(responses={200: s.QueueSerializer})
    def get(self, request: Request) -> Response:
        return Response(s.QueueSerializer(lab_selectors.queue_state()).data)


class DevicePauseApi(APIView):
    """Pause a device (lab admins only): the scheduler leases it to no new round; a round
    training on it finishes. ``reason`` is shown on the queue page."""

    permission_classes = [IsAuthenticated, IsLabAdmin]

    @extend_schema(request=s.DevicePauseSerializer, responses={200: s.LabDeviceSerializer})
    def post(self, request: Request, id: int) -> Response:
        device = get_object_or_404(Device, pk=id)
        data = validated_data(s.DevicePauseSerializer, request)
        device = lab_admin.device_pause(device=device, user=request.user, reason=data["reason"])
        return Response(s.LabDeviceSerializer(device).data)


class DeviceResumeApi(APIView):
    """Resume a paused device (lab admins only): waiting rounds may have it again at once."""

    permission_classes = [IsAuthenticated, IsLabAdmin]

    @extend_schema(request=s.DeviceResumeSerializer, responses={200: s.LabDeviceSerializer})
    def post(self, request: Request, id: int) -> Response:
        device = get_object_or_404(Device, pk=id)
        validated_data(s.DeviceResumeSerializer, request)
        device = lab_admin.device_resume(device=device, user=request.user)
        return Response(s.LabDeviceSerializer(device).data)


@extend_schema_view(partial_update=extend_schema(request=s.PoolUpdateSerializer, responses={200: s.PoolSerializer}))
class PoolViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Device pools: devices of one device class that a run may name (``pool`` on
    ``POST /api/experiments/{id}/runs/``) instead of fixed devices; the lab scheduler places its
    rounds on the pool's free devices. Every user reads them; lab admins (staff) create and
    change them."""

    serializer_class = s.PoolSerializer
    permission_classes = [IsLabAdminOrReadOnly]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return lab_selectors.pool_list()

    @extend_schema(request=s.PoolCreateSerializer, responses={201: s.PoolSerializer})
    def create(self, request: Request) -> Response:
        data = validated_data(s.PoolCreateSerializer, request)
        pool = lab_admin.pool_create(
            name=data["name"], description=data["description"], devices=data["devices"], user=request.user
        )
        answer = self.get_queryset().get(id=pool.id)
        answer.warnings = getattr(pool, "warnings", [])
        return Response(s.PoolSerializer(answer).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, pk=None) -> Response:
        """Delete a pool (lab admins); 409 while runs name it. Its devices serve in no pool."""
        lab_admin.pool_delete(pool=self.get_object(), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=s.PoolUpdateSerializer, responses={200: s.PoolSerializer})
    def update(self, request: Request, pk=None, partial=False) -> Response:
        pool = self.get_object()
        data = validated_data(s.PoolUpdateSerializer, request, partial=True)
        warnings: list[str] = []
        if "devices" in data:
            changed = lab_admin.pool_set_devices(pool=pool, devices=data["devices"], user=request.user)
            warnings = getattr(changed, "warnings", [])
        answer = self.get_queryset().get(id=pool.id)
        answer.warnings = warnings
        return Response(s.PoolSerializer(answer).data)
