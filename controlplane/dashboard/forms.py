"""Dashboard forms: they parse what the browser sends into types; every rule about values is the
services' (so a page shows the same message as the API)."""

from __future__ import annotations

from django import forms
from django.core.exceptions import ValidationError

from controlplane.experiments.services.templates import DEFAULT_ROUNDS, MAX_NAME_LENGTH, TEMPLATES
from controlplane.fleet import selectors as fleet_selectors


class IdListField(forms.Field):
    """A multi-select of ids, parsed to ``list[int]`` (which ids exist is the service's check)."""

    widget = forms.SelectMultiple

    def to_python(self, value) -> list[int]:
        try:
            return [int(v) for v in value or []]
        except (TypeError, ValueError):
            raise ValidationError("must be a list of ids") from None


class ExperimentFromTemplateForm(forms.Form):
    """The index page's "New experiment from a template": template, devices, optionally a name and rounds."""

    template = forms.CharField(
        label="Template",
        widget=forms.Select(choices=[(t.name, f"{t.name}: {t.title}") for t in TEMPLATES.values()]),
    )
    devices = IdListField(required=False, label="Devices", help_text="Ctrl or ⌘ to pick several")
    name = forms.CharField(
        required=False, strip=True, label="Name (optional)",
        widget=forms.TextInput(attrs={"placeholder": "default: <template> mix", "maxlength": MAX_NAME_LENGTH}),
    )
    rounds = forms.IntegerField(
        required=False, label="Rounds (optional)", error_messages={"invalid": "must be an integer"},
        widget=forms.NumberInput(attrs={"min": 1, "max": 10_000, "placeholder": f"default {DEFAULT_ROUNDS}"}),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["devices"].widget.choices = [(d.id, d.name) for d in fleet_selectors.device_list()]
        self.fields["devices"].widget.attrs["size"] = min(8, max(2, len(self.fields["devices"].widget.choices)))

    def service_arguments(self) -> dict:
        """The cleaned data as keyword arguments of
        :func:`~controlplane.experiments.services.templates.experiment_create_from_template`
        (fields left empty are left out, so the service's defaults apply)."""
        data = self.cleaned_data
        arguments = {"template": data["template"], "device_ids": data["devices"]}
        if data.get("name"):
            arguments["name"] = data["name"]
        if data.get("rounds") is not None:
            arguments["rounds"] = data["rounds"]
        return arguments
