"""A declared parameter's kinds (workers.registry.base.Parameter): besides the numeric ones, a
switch (``"bool"``) and a name out of a list (``"choice"``), as the server optimisers' conventions
need them; their declarations are checked when made, their values where they enter."""

from __future__ import annotations

import pytest

from workers.registry.base import Parameter

SWITCH = Parameter("bias_correction", "a switch", "bool", default=False)
CHOICE = Parameter("initial_v", "a name", "choice", choices=("tau_squared", "zero"), default="tau_squared")


@pytest.mark.parametrize("value,expected", [(True, True), (False, False), ("true", True), (" False ", False)])
def test_a_switch_takes_booleans_and_the_words(value, expected):
    assert SWITCH.check(value, group="aggregation_params") is expected


@pytest.mark.parametrize("value", [1, 0, "yes", None, 1.0])
def test_a_switch_refuses_anything_else_naming_the_field(value):
    with pytest.raises(ValueError, match=rf"^aggregation_params\.bias_correction must be true or false, got {value!r}"):
        SWITCH.check(value, group="aggregation_params")


def test_a_choice_takes_one_of_its_names_exactly():
    assert CHOICE.check("zero") == "zero"
    for bad in ("Zero", "", 0, None):
        with pytest.raises(ValueError, match=r"partition_params\.initial_v must be one of tau_squared, zero, got "):
            CHOICE.check(bad)


def test_the_allowed_text_says_what_each_kind_takes():
    assert (SWITCH.allowed, CHOICE.allowed) == ("true or false", "one of tau_squared, zero")
    assert not SWITCH.numeric and not CHOICE.numeric and Parameter("x", "x", "float", 0.0, 1.0).numeric


@pytest.mark.parametrize(
    "declare,match",
    [
        (lambda: Parameter("v", "v", "choice"), "a choice needs its choices"),
        (lambda: Parameter("v", "v", "choice", choices=("a", "")), "a choice needs its choices"),
        (lambda: Parameter("v", "v", "choice", choices=("a",), default="b"), r"must be one of a, got 'b'"),
        (lambda: Parameter("v", "v", "bool", default="maybe"), "must be true or false"),
        (lambda: Parameter("v", "v", "text"), "kind must be one of int, float, bool, choice"),  # type: ignore[arg-type]
    ],
)
def test_a_bad_declaration_is_refused_when_made(declare, match):
    with pytest.raises(ValueError, match=match):
        declare()
