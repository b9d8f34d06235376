"""The REST API (DRF): serializers validate shape, services do the work; OpenAPI by drf-spectacular."""
