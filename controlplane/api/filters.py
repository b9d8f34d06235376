"""Filtering of the API's lists (django-filter), checked like every other input."""

from __future__ import annotations

import django_filters
from django import forms
from django.db import models
from django_filters import rest_framework as filters


class IntegerFilter(django_filters.NumberFilter):
    """A filter on an integer column: ``?index=0.5`` is a 400 naming ``index`` (django-filter's
    ``NumberFilter`` takes any decimal and quietly matches nothing)."""

    field_class = forms.IntegerField


class FilterSet(filters.FilterSet):
    """The API's filter sets: integer columns get :class:`IntegerFilter`."""

    FILTER_DEFAULTS = {
        **filters.FilterSet.FILTER_DEFAULTS,
        **{
            field: {"filter_class": IntegerFilter}
            for field in (models.AutoField, models.SmallIntegerField, models.IntegerField, models.PositiveIntegerField,
                          models.PositiveSmallIntegerField)
        },
    }


class FilterBackend(filters.DjangoFilterBackend):
    """django-filter's backend building :class:`FilterSet` for views that list ``filterset_fields``."""

    filterset_base = FilterSet
