"""Each user-facing numeric field's range is declared once (:mod:`controlplane.common.limits`):
the model, the API serializer, the dashboard form and the CLI read the same bounds, and no
bound of a declared field is written as a literal anywhere else in ``controlplane/``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.validators import MaxValueValidator, MinValueValidator

from controlplane.api import serializers as api
from controlplane.common import limits
from controlplane.common.errors import ApplicationError
from controlplane.common.limits import LIMITS, Limit
from controlplane.core.management.commands import compare, create_experiment, profile
from controlplane.dashboard import forms
from controlplane.experiments.models import Assignment, Comparison, Experiment, Run
from controlplane.experiments.services.catalog import check_limit
from controlplane.lab.models import UserShare

ROOT = Path(__file__).resolve().parents[2]

# --- the layers read the declared bounds -------------------------------------------------------

MODEL_FIELDS = [
    (Experiment, "rounds", limits.ROUNDS),
    (Experiment, "local_epochs", limits.LOCAL_EPOCHS),
    (Experiment, "deadline_factor", limits.DEADLINE_FACTOR),
    (Experiment, "client_fraction", limits.CLIENT_FRACTION),
    (Experiment, "keep_last_checkpoints", limits.KEEP_LAST_CHECKPOINTS),
    (Experiment, "device_retries", limits.DEVICE_RETRIES),
    (Comparison, "repeats", limits.REPEATS),
    (Run, "priority", limits.PRIORITY),
    (Assignment, "active_thread_percentage", limits.ACTIVE_THREAD_PERCENTAGE),
    (UserShare, "weight", limits.SHARE_WEIGHT),
]


def _validator_bounds(model, field: str) -> tuple[float | None, float | None]:
    validators = model._meta.get_field(field).validators
    low = [v.limit_value for v in validators if type(v) is MinValueValidator]
    high = [v.limit_value for v in validators if type(v) is MaxValueValidator]
    return (low[0] if low else None), (high[0] if high else None)


@pytest.mark.parametrize(("model", "field", "limit"), MODEL_FIELDS, ids=lambda x: getattr(x, "name", None))
def test_model_validators_read_the_declared_bounds(model, field, limit: Limit):
    low, high = _validator_bounds(model, field)
    assert high == limit.high
    # A positive field's 0 needs no validator (device_retries); any other lower end is validated.
    assert low == limit.low or (low is None and limit.low == 0)


SERIALIZER_FIELDS = [
    (api.ExperimentCreateSerializer, "rounds", limits.ROUNDS),
    (api.ExperimentCreateSerializer, "local_epochs", limits.LOCAL_EPOCHS),
    (api.ExperimentCreateSerializer, "seed", limits.SEED),
    (api.ExperimentCreateSerializer, "device_retries", limits.DEVICE_RETRIES),
    (api.ExperimentCreateSerializer, "keep_last_checkpoints", limits.KEEP_LAST_CHECKPOINTS),
    (api.ExperimentUpdateSerializer, "rounds", limits.ROUNDS),
    (api.ExperimentUpdateSerializer, "local_epochs", limits.LOCAL_EPOCHS),
    (api.ExperimentUpdateSerializer, "device_retries", limits.DEVICE_RETRIES),
    (api.ExperimentUpdateSerializer, "keep_last_checkpoints", limits.KEEP_LAST_CHECKPOINTS),
    (api.TaskWriteSerializer, "num_classes", limits.NUM_CLASSES),
    (api.RunCreateSerializer, "priority", limits.PRIORITY),
    (api.ComparisonCreateSerializer, "priority", limits.PRIORITY),
    (api.ComparisonCreateSerializer, "repeats", limits.REPEATS),
    (api.ManualPlanEntrySerializer, "batch_size", limits.BATCH_SIZE),
    (api.ManualPlanEntrySerializer, "active_thread_percentage", limits.ACTIVE_THREAD_PERCENTAGE),
    (api.ProfileSweepCreateSerializer, "seed", limits.SEED),
]


@pytest.mark.parametrize(
    ("serializer", "field", "limit"), SERIALIZER_FIELDS, ids=lambda x: getattr(x, "__name__", getattr(x, "name", x))
)
def test_serializer_bounds_are_the_declared_ones(serializer, field, limit: Limit):
    f = serializer().fields[field]
    assert (f.min_value, f.max_value) == (limit.low, limit.high)
    assert f"allowed {limit.span}" in f.error_messages["max_value"]


def test_serializer_help_texts_and_list_children_read_the_declared_bounds():
    """Float fields are ``number()`` (the service checks their range); their help says it."""
    assert limits.DEADLINE_FACTOR.span in api.DEADLINE_FACTOR_HELP
    assert limits.CLIENT_FRACTION.interval in api.CLIENT_FRACTION_HELP
    assert limits.KEEP_LAST_CHECKPOINTS.span in api.KEEP_LAST_CHECKPOINTS_HELP
    template = api.ExperimentFromTemplateSerializer().fields
    assert template["rounds"].help_text.startswith(limits.ROUNDS.span)
    assert template["local_epochs"].help_text.startswith(limits.LOCAL_EPOCHS.span)
    assert template["seed"].help_text.startswith(limits.SEED.span)
    assert limits.DIRICHLET_ALPHA.interval in template["dirichlet_alpha"].help_text
    assert limits.TARGET_ACCURACY.interval in api.ComparisonCreateSerializer().fields["targets"].help_text
    child = api.ProfileSweepCreateSerializer().fields["batch_sizes"].child
    assert (child.min_value, child.max_value) == (limits.BATCH_SIZE.low, limits.BATCH_SIZE.high)


FORM_FIELDS = [
    (forms.ExperimentForm, "rounds", limits.ROUNDS),
    (forms.ExperimentForm, "local_epochs", limits.LOCAL_EPOCHS),
    (forms.ExperimentForm, "client_fraction", limits.CLIENT_FRACTION),
    (forms.ExperimentForm, "keep_last_checkpoints", limits.KEEP_LAST_CHECKPOINTS),
    (forms.ExperimentFromTemplateForm, "rounds", limits.ROUNDS),
    (forms.TaskForm, "num_classes", limits.NUM_CLASSES),
    (forms.TaskForm, "learning_rate", limits.LEARNING_RATE),
    (forms.TaskForm, "momentum", limits.MOMENTUM),
    (forms.TaskForm, "weight_decay", limits.WEIGHT_DECAY),
]


@pytest.mark.parametrize(
    ("form", "field", "limit"), FORM_FIELDS, ids=lambda x: getattr(x, "__name__", getattr(x, "name", x))
)
def test_form_inputs_carry_the_declared_bounds(form, field, limit: Limit):
    attrs = form.base_fields[field].widget.attrs
    assert (float(attrs["min"]), float(attrs["max"])) == (limit.low, limit.high)


def _helps(command) -> dict[str, str]:
    parser = command.Command().create_parser("manage.py", command.__name__.rsplit(".", 1)[-1])
    return {a.dest: a.help or "" for a in parser._actions}


def test_cli_help_states_the_declared_bounds():
    helps = _helps(create_experiment)
    assert limits.ROUNDS.span in helps["rounds"]
    assert limits.LOCAL_EPOCHS.span in helps["local_epochs"]
    assert limits.SEED.span in helps["seed"]
    assert limits.DIRICHLET_ALPHA.interval in helps["alpha"]
    assert limits.CLIENT_FRACTION.interval in helps["client_fraction"]
    assert limits.KEEP_LAST_CHECKPOINTS.span in helps["keep_last_checkpoints"]
    helps = _helps(compare)
    assert helps["priority"].startswith(limits.PRIORITY.span)
    assert limits.REPEATS.span in helps["repeats"]
    assert limits.TARGET_ACCURACY.interval in helps["target"]
    assert "batch_sizes" in _helps(profile)


@pytest.mark.parametrize("limit", list(LIMITS.values()), ids=lambda limit: limit.name)
def test_the_services_check_the_declared_range(limit: Limit):
    middle = (limit.low + limit.high) / 2
    assert check_limit(middle, limit) == middle
    beyond = limit.high + 1
    with pytest.raises(ApplicationError) as exc:
        check_limit(beyond, limit)
    assert exc.value.message == f"{limit.name}={beyond!r} is out of range: allowed {limit.interval}"


def test_the_messages_read_as_before():
    """The services' words for the most used fields, unchanged by reading the declarations."""
    assert limits.ROUNDS.span == "1 to 10000"
    assert limits.ROUNDS.interval == "[1, 10000]"
    assert limits.CLIENT_FRACTION.interval == "(0, 1]"
    assert limits.MOMENTUM.interval == "[0, 1)"
    assert limits.PRIORITY.span == "-10 to 10"
    assert limits.SEED.span == "0 to 2147483647"


# --- no bound written twice ------------------------------------------------------------------------

# Per declared field: the names it goes by (the context), and how its bounds would be written as
# literals. A literal counts for the field whose name is written nearest (same line first, then
# up to WINDOW lines away), so `1 to 10000` in keep_last_checkpoints' help is not rounds'.
SCAN: dict[str, tuple[str, str]] = {
    "rounds": (r"\brounds\b|Rounds", r"(?<!max_length=)\b10_?000\b(?!\d)"),
    "local_epochs": (r"local_epochs|local-epochs|Local epochs", r"(?<![\d.])1_?000\b(?![_\d])"),
    "keep_last_checkpoints": (
        r"keep_last_checkpoints|keep-last-checkpoints|KEEP_LAST_CHECKPOINTS|Checkpoints kept|checkpoints",
        r"(?<!max_length=)\b10_?000\b",
    ),
    "device_retries": (r"device_retries|device-retries|MAX_DEVICE_RETRIES", r"(?<![\d.-])10\b(?![_\d.])"),
    "deadline_factor": (
        r"deadline_factor|deadline-factor|DEADLINE_FACTOR",
        r"(?<![\d.])1(\.0)?, 100(\.0)?\b|1 to 100\b|100\.0",
    ),
    "repeats": (r"\brepeats\b|MAX_REPEATS", r"(?<![\d.-])10\b(?![_\d.])"),
    "priority": (r"priority", r"-10\b"),
    "active_thread_percentage": (r"active_thread_percentage|percentage", r"(?<![\d.])1, 100\b|1 to 100\b"),
    "batch_size": (r"batch_size|BATCH_SIZE|batch sizes|batch_sizes", r"\b4096\b|(?<![\d.])= 2\b|integer\(2,"),
    "seed": (r"\bseed\b|--seed", r"2\*\*31 - 1|2147483647"),
    "num_classes": (r"num_classes|NUM_CLASSES|Classes", r"\b100_?000\b"),
    "learning_rate": (r"learning_rate|Learning rate", r"0\.0, 10\.0|max=10\b"),
    "momentum": (r"momentum|Momentum", r"0\.0, 1\.0|max=1\b"),
    "weight_decay": (r"weight_decay|Weight decay", r"0\.0, 1\.0|max=1\b"),
    "client_fraction": (r"client_fraction|client-fraction|Fraction of devices", r"\(0, 1\]|0\.0, 1\.0|max=1\b"),
    "target_accuracy": (r"target|accuracy", r"\(0, 1\]|0 < value <= 1|at most 1\b"),
    "dirichlet_alpha": (r"dirichlet|alpha", r"\(0, 1000\]|1000\.0|1_?000\b"),
    "weight": (r"UserShare|lab_share|weigh 1", r"0\.01\b|100\.0"),
    "budget_s": (r"[Bb]udget|BUDGET", r"\b604_?800\b|7 \* 24 \* 3600|\b1_?800\b|30 \* 60"),
}
WINDOW = 4
# Numbers that look like a declared bound but are something else, by file and the line's text.
NOT_BOUNDS = {
    # the demo's own cap on its rounds (smaller than the field's), not the field's range
    ("controlplane/core/management/commands/demo.py", "1000,"),
    # a trainer's seed per round, not local_epochs' bound
    ("controlplane/experiments/services/rounds/requests.py", "seed=experiment.seed * 1000 + rnd.index,"),
    # the stored error text's length
    ("controlplane/experiments/services/rounds/record.py", "error=error[:10_000],"),
    # a run's timeout in seconds, beside --repeats
    (
        "controlplane/core/management/commands/compare.py",
        'timeout_s = int_option("timeout", opts["timeout"], 10, 7 * 24 * 3600)',
    ),
}


def literal_bounds(root: Path) -> dict[str, list[str]]:
    """``{field: ["path:line", ...]}``: where a declared field's bounds are written as literals
    in ``root``'s ``controlplane/`` (migrations and limits.py itself left out)."""
    hits: dict[str, list[str]] = {f: [] for f in SCAN}
    for path in sorted((root / "controlplane").rglob("*.py")):
        rel = str(path.relative_to(root))
        if "migrations" in rel or rel == "controlplane/common/limits.py":
            continue
        lines = path.read_text().splitlines()
        context = {f: [i for i, line in enumerate(lines) if re.search(c, line)] for f, (c, _) in SCAN.items()}
        for i, line in enumerate(lines):
            if (rel, line.strip()) in NOT_BOUNDS:
                continue
            candidates = []
            for f, (_, literal) in SCAN.items():
                if re.search(literal, line):
                    near = [abs(j - i) for j in context[f] if abs(j - i) <= WINDOW]
                    if near:
                        candidates.append((min(near), f))
            if candidates:
                best = min(d for d, _ in candidates)
                hits.update({f: hits[f] + [f"{rel}:{i + 1}"] for d, f in candidates if d == best})
    return hits


def test_the_scan_covers_every_declared_field():
    assert set(SCAN) == set(LIMITS)


def test_no_declared_bound_is_written_as_a_literal_elsewhere():
    found = {f: where for f, where in literal_bounds(ROOT).items() if where}
    assert not found, f"read these bounds from controlplane.common.limits instead: {found}"


def test_the_scan_finds_a_literal_bound(tmp_path):
    """The check is shown to fail: a bound written by hand next to its field is found."""
    module = tmp_path / "controlplane" / "x.py"
    module.parent.mkdir()
    module.write_text('rounds = integer(1, 10_000)\nhelp_text = "accuracy in (0, 1]"\n')
    hits = literal_bounds(tmp_path)
    assert hits["rounds"] == ["controlplane/x.py:1"]
    assert hits["target_accuracy"] == ["controlplane/x.py:2"]
