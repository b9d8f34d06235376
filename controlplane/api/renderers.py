"""Response renderers."""

from __future__ import annotations

from rest_framework.renderers import JSONRenderer

from controlplane.common.jsonsafe import finite_or_none


class FiniteJSONRenderer(JSONRenderer):
    """DRF's strict JSON renderer, but a NaN or infinity in the data (a FloatField may store
    one) is rendered as ``null`` instead of failing the request with a 500.

    The data is rendered as usual first; only when that fails on an out-of-range float is it
    cleaned (:func:`controlplane.common.jsonsafe.finite_or_none`) and rendered again, so
    ordinary responses pay nothing for the check.
    """

    def render(self, data, accepted_media_type=None, renderer_context=None):
        try:
            return super().render(data, accepted_media_type, renderer_context)
        except ValueError as exc:
            if "Out of range float values" not in str(exc):
                raise
        return super().render(finite_or_none(data, self.encoder_class().default), accepted_media_type, renderer_context)
