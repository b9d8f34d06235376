"""Dashboard forms. They render inputs and read what the browser sends; every check on the values
is the API's own: the API's serializer for types and ranges (:class:`ApiCheckedForm`), then the
service, whose :class:`~controlplane.common.errors.ApplicationError` the view shows at the field it
names (:meth:`ApiCheckedForm.add_service_error`). So a page and the API answer the same input with
the same message, and no message is written twice.

A form shows every error at once (:meth:`ApiCheckedForm.submit`): the serializer reports every
field it refuses, and the service, which stops at its first refusal, is asked again with each
refused argument at its default until it accepts the rest, inside a transaction rolled back
whenever anything was refused."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import Any

from django import forms
from django.db import transaction
from rest_framework import serializers as drf

from controlplane.api import serializers as api
from controlplane.api.exception_handlers import flatten_errors
from controlplane.common.errors import ApplicationError
from controlplane.common.limits import (
    ACTIVE_THREAD_PERCENTAGE,
    BATCH_SIZE,
    CLIENT_FRACTION,
    KEEP_LAST_CHECKPOINTS,
    LEARNING_RATE,
    LOCAL_EPOCHS,
    MOMENTUM,
    NUM_CLASSES,
    REPEATS,
    ROUNDS,
    SWEEP_BUDGET,
    SWEEP_BUDGET_SELF_SERVE,
    TARGET_ACCURACY,
    WEIGHT_DECAY,
    Limit,
    bound_text,
)
from controlplane.experiments import selectors as experiment_selectors
from controlplane.experiments.models import Experiment
from controlplane.experiments.services.templates import (
    DEFAULT_ROUNDS,
    MAX_NAME_LENGTH,
    TEMPLATES,
)
from controlplane.fleet import selectors as fleet_selectors
from controlplane.planning.lr_scaling import DEFAULT_LR_SCALING
from controlplane.planning.strategies import STRATEGY_REGISTRY, baseline_strategy, compared_strategies
from controlplane.profiling import selectors as profiling_selectors
from controlplane.profiling.services.sweeps import DEFAULT_ARCHITECTURES, is_lab_staff, sweep_budget_limit
from workers.protocol.messages import OPTIMIZERS
from workers.registry.aggregators import AGGREGATOR_REGISTRY
from workers.registry.backends import BACKEND_REGISTRY
from workers.registry.base import Registry
from workers.registry.datasets import DATASET_REGISTRY, Dataset
from workers.registry.models import MODEL_REGISTRY
from workers.registry.partitioners import PARTITIONER_REGISTRY, PartitionParameter


def _input(widget: forms.Widget, label: str, *, help_text: str = "", initial: Any = None) -> forms.Field:
    """A form field that only renders and reads its input: no conversion and no check of its own
    (those are the API serializer's, in :meth:`ApiCheckedForm.clean`)."""
    return forms.Field(required=False, widget=widget, label=label, help_text=help_text, initial=initial)


def _select(choices, **attrs) -> forms.Select:
    return forms.Select(choices=[(c, c) if isinstance(c, str) else c for c in choices], attrs=attrs)


def _registered(registry: Registry[Any], *, keep: Any = None) -> list[tuple[str, str]]:
    """``(name, label)`` of every record of ``registry`` (those ``keep`` accepts, when given),
    read when a form is made, so a plug-in registered at run time is listed at once."""
    return [(r.name, r.label) for r in registry.records() if keep is None or keep(r)]


def _registered_select(form: forms.Form, field: str, choices: list[tuple[str, str]]) -> None:
    """Give ``form``'s ``field`` a select of ``choices`` (the registry's now, not at import)."""
    form.fields[field].widget = _select(choices)


def _number(limit: Limit | None = None, **attrs) -> forms.NumberInput:
    """A number input; with ``limit``, its declared range as the browser's ``min``/``max``."""
    if limit is not None:
        attrs = {"min": bound_text(limit.low), "max": bound_text(limit.high), **attrs}
    return forms.NumberInput(attrs={"step": "any", **attrs})


class _Refused(Exception):
    """Rolls back :meth:`ApiCheckedForm.submit`'s transaction when some input was refused."""


class ApiCheckedForm(forms.Form):
    """A form checked by the API serializer of the same request, then by the service.

    The payload is what a JSON client would send: every field the browser filled in (a blank
    input counts as left out, so the service's default applies; a multi-select is a list, empty
    when nothing is picked). Serializer errors land at the form field they name
    (``error_fields`` maps nested names such as ``options.slack``), the others above the form.
    After :meth:`is_valid`, ``validated`` holds the serializer's validated data: when some fields
    were refused, that of the others (the refused ones at the form's initial value, or left out),
    so :meth:`submit` can still ask the service about them; ``None`` when even that is refused.
    """

    serializer_class: type[drf.Serializer]
    serializer_kwargs: dict[str, Any] = {}
    error_fields: dict[str, str] = {}
    service_argument_names: dict[str, str] = {}
    """The service's argument of each field its messages name, where the names differ
    (``tasks`` → ``task_ids``)."""

    max_probes: int = 1
    """How many more times :meth:`submit` may ask the service after it refused (each past the
    refused argument, :meth:`probe_replace`), so a page shows the service's next refusal too.
    A service that is expensive to ask (task creation checks the plug-in and its data in a child
    process) sets 0 and :attr:`expensive`."""
    expensive: bool = False
    """The service is not asked at all while the serializer refuses some field: the call could
    only probe (it is rolled back), and costs a child process."""

    validated: dict[str, Any] | None = None
    status_code: int = 400
    """What the page answers after :meth:`submit` refused: 400, or the service's own status
    (409: the state forbids it) when the form was otherwise valid."""

    def payload(self) -> dict[str, Any]:
        """The request body a JSON client would send for this input."""
        return {name: value for name, value in self.cleaned_data.items() if value is not None and value != ""}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        payload = self.payload()
        serializer = self.serializer_class(data=payload, **self.serializer_kwargs)
        if serializer.is_valid():
            self.validated = dict(serializer.validated_data)
            return cleaned
        errors = flatten_errors(serializer.errors)
        self._add_serializer_errors(errors)
        self.validated = self._validated_without(payload, set(errors))
        return cleaned

    def _add_serializer_errors(self, errors: Mapping[str, list[str]]) -> None:
        for key, messages in errors.items():
            field = self._form_field(key)
            for message in messages:
                # Shown at its own field: the message alone, as under the API's ``errors``;
                # elsewhere it keeps the name it is about (as the API's ``message`` does).
                shown = (
                    message
                    if field == key or key in self.error_fields or key == "non_field_errors"
                    else f"{key}: {message}"
                )
                self.add_error(field, shown)

    def _validated_without(self, payload: dict[str, Any], keys: set[str]) -> dict[str, Any] | None:
        """The serializer's data for ``payload`` with the fields its errors name (``keys``, as
        :func:`flatten_errors` writes them) at their form field's initial value, left out when
        it has none (:meth:`probe_payload`); ``None`` if that is still refused."""
        if "non_field_errors" in keys:
            return None
        probe = self.probe_payload(dict(payload), keys)
        serializer = self.serializer_class(data=probe, **self.serializer_kwargs)
        return dict(serializer.validated_data) if serializer.is_valid() else None

    def probe_payload(self, payload: dict[str, Any], keys: set[str]) -> dict[str, Any]:
        """``payload`` with each field that ``keys`` name (their top-level names) at its form
        field's initial value, or left out."""
        refused = {re.split(r"[.\[]", key, maxsplit=1)[0] for key in keys}
        probe = {k: v for k, v in payload.items() if k not in refused}
        for name in refused:
            initial = self.fields[name].initial if name in self.fields else None
            if initial is not None and initial != "":
                probe[name] = initial
        return probe

    def _form_field(self, key: str) -> str | None:
        if key in self.error_fields:
            return self.error_fields[key]
        root = re.split(r"[.\[]", key, maxsplit=1)[0]
        return root if root in self.fields else None

    def add_service_error(self, exc: ApplicationError) -> None:
        """Show a service's message at the field it names (above the form if that is not one of
        this form's fields)."""
        field = self.error_fields.get(exc.field or "", exc.field)
        self.add_error(field if field in self.fields else None, exc.message)

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of the form's service (its validated data unless a form says otherwise)."""
        return dict(self.validated or {})

    def submit(self, service: Callable[..., Any], **fixed: Any) -> Any:
        """Check the form and call ``service(**fixed, **self.service_arguments())``: its result,
        or ``None`` with every refusal at its field (:attr:`status_code` says what to answer).

        Every error shows at once, within bounds: when the service refuses an argument, it is
        asked again with that argument at the service's own default (:meth:`probe_replace`), at
        most :attr:`max_probes` more times (each call may run the whole service); all of it
        inside one transaction, rolled back (and the work queued on commit dropped) whenever
        anything was refused. An :attr:`expensive` service is not asked while the serializer
        refuses a field.
        """
        valid = self.is_valid()
        if self.validated is None or (self.expensive and not valid):
            return None
        refusals: list[ApplicationError] = []
        try:
            with transaction.atomic():
                result = self._call_until_accepted(service, fixed, self.service_arguments(), refusals)
                if refusals or not valid:
                    raise _Refused
        except _Refused:
            for exc in refusals:
                self.add_service_error(exc)
            self.status_code = refusals[0].status_code if valid and refusals else 400
            return None
        return result

    def _call_until_accepted(
        self, service: Callable[..., Any], fixed: dict[str, Any], arguments: dict[str, Any], refusals: list
    ) -> Any:
        replaced: set[Any] = set()
        for _ in range(1 + max(0, self.max_probes)):
            try:
                with transaction.atomic():
                    return service(**fixed, **arguments)
            except ApplicationError as exc:
                if refusals and self._argument_name(exc) in replaced:
                    # About the value put in for a refused one (a default that another field
                    # rules out): no news to the researcher.
                    return None
                refusals.append(exc)
                if not self.probe_replace(exc, service, arguments, replaced):
                    return None
        return None

    def _argument_name(self, exc: ApplicationError) -> str:
        root = re.split(r"[.\[]", exc.field or "", maxsplit=1)[0]
        return self.service_argument_names.get(root, root)

    def probe_replace(
        self, exc: ApplicationError, service: Callable[..., Any], arguments: dict[str, Any], replaced: set[Any]
    ) -> bool:
        """Replace in ``arguments`` the one ``exc`` refused by the service's default, so the
        next call reports the next refusal; ``False`` when none can be (no field named, no
        default, or already replaced once)."""
        name = self._argument_name(exc)
        parameter = inspect.signature(service).parameters.get(name)
        if not name or name in replaced or name not in arguments or parameter is None:
            return False
        if parameter.default is inspect.Parameter.empty:
            return False
        arguments[name] = parameter.default
        replaced.add(name)
        return True


def _device_choices() -> list[tuple[int, str]]:
    return [(d.id, f"{d.name} ({d.backend})") for d in fleet_selectors.device_list()]


def _multi(choices: list, *, max_rows: int = 8) -> forms.SelectMultiple:
    return forms.SelectMultiple(choices=choices, attrs={"size": min(max_rows, max(3, len(choices)))})


# --- devices and tasks (the lab's shared catalogue) -------------------------------------------


class DeviceForm(ApiCheckedForm):
    """Register a device (``POST /api/devices/``); its agent then serves it."""

    serializer_class = api.DeviceCreateSerializer

    name = _input(
        forms.TextInput(attrs={"placeholder": "e.g. gpu-a", "maxlength": 63, "autocomplete": "off"}),
        "Name",
        help_text="lower-case letters, digits, '-' or '_' (1 to 63); it names the device's queue, device.<name>",
    )
    backend = _input(
        _select([]),
        "Backend",
        initial="cpu",
        help_text="how the agent trains; numbers from simulated devices are labelled simulated",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _registered_select(self, "backend", _registered(BACKEND_REGISTRY))


def _shape_text(dataset: Dataset) -> str:
    """What a data set's record says of its samples, for its option in the task form:
    ``"3×32×32, 10 classes"``, or what follows from its files (``"shape from the files"``)."""
    if dataset.input_shape is None and dataset.num_classes is None:
        return "shape from the files"
    shape = "×".join(str(n) for n in dataset.input_shape) if dataset.input_shape else "shape from the files"
    classes = f"{dataset.num_classes} classes" if dataset.num_classes else "classes from the files"
    return f"{shape}, {classes}"


def _model_choices() -> list[tuple[str, str]]:
    """``(name, "label · source")`` of every installed model (source: the distribution and its
    version providing it, e.g. ``mtfl-lab 0.4.0`` for the zoo)."""
    return [(m.name, f"{m.label} · {MODEL_REGISTRY.source(m.name)}") for m in MODEL_REGISTRY.records()]


def _dataset_choices() -> list[tuple[str, str]]:
    """``(name, "label (shape, classes) · source")`` of every installed data set."""
    return [
        (d.name, f"{d.label} ({_shape_text(d)}) · {DATASET_REGISTRY.source(d.name)}")
        for d in DATASET_REGISTRY.records()
    ]


class _DatasetSelect(forms.Select):
    """The data set select; each option says whether the data set reads the task's
    ``dataset_root`` (``data-needs-root``), so the page shows that input only when it is needed."""

    def create_option(self, name, value, label, selected, index, subindex=None, attrs=None):
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        if value in DATASET_REGISTRY:
            option["attrs"]["data-needs-root"] = "true" if DATASET_REGISTRY.get(value).needs_root else "false"
        return option


class TaskForm(ApiCheckedForm):
    """Define a learning task (``POST /api/tasks/``): an installed model trained on an installed
    data set. The API checks the pair in a child process (the plug-in check) before saving; its
    refusal shows at the field it names (``architecture``, ``dataset``, ``dataset_root`` or
    ``num_classes``)."""

    serializer_class = api.TaskWriteSerializer
    # task_create checks the plug-in and its data in a child process: asked once, never to probe.
    max_probes = 0
    expensive = True

    name = _input(
        forms.TextInput(attrs={"placeholder": "e.g. digits-resnet18", "maxlength": 100, "autocomplete": "off"}),
        "Name",
        help_text="unique in the lab",
    )
    architecture = _input(_select([]), "Model", initial="resnet18", help_text="installed models · their package")
    dataset = _input(_DatasetSelect(), "Data set", initial="digits")
    dataset_root = _input(
        forms.TextInput(attrs={"placeholder": "/data/my-set"}),
        "Data folder or file",
        help_text="",
    )
    num_classes = _input(
        _number(NUM_CLASSES, step=1, placeholder="from the data"),
        "Classes (optional)",
        help_text="blank: as the data set says, or the largest training label + 1",
    )
    optimizer = _input(_select(OPTIMIZERS), "Optimizer", initial="sgd")
    learning_rate = _input(_number(LEARNING_RATE), "Learning rate", initial=0.05)
    momentum = _input(_number(MOMENTUM), "Momentum", initial=0.9, help_text="sgd only")
    weight_decay = _input(_number(WEIGHT_DECAY), "Weight decay", initial=5e-4)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _registered_select(self, "architecture", _model_choices())
        self.fields["dataset"].widget.choices = _dataset_choices()
        reading = [d.name for d in DATASET_REGISTRY.records() if d.needs_root]
        self.fields["dataset_root"].help_text = (
            f"on every host that trains the task; needed by {', '.join(reading)}; nothing is downloaded"
            if reading
            else "no installed data set reads files"
        )


# --- experiments ------------------------------------------------------------------------------


def _range_text(parameter: PartitionParameter) -> str:
    """A parameter's allowed values as the API's messages write them: ``"in (0, 1000]"``,
    ``"an integer ≥ 1"``."""
    low = "(" if parameter.minimum_open else "["
    if parameter.minimum is not None and parameter.maximum is not None:
        text = f"in {low}{parameter.minimum:g}, {parameter.maximum:g}]"
    elif parameter.minimum is not None:
        text = f"{'>' if parameter.minimum_open else '≥'} {parameter.minimum:g}"
    elif parameter.maximum is not None:
        text = f"≤ {parameter.maximum:g}"
    else:
        text = "any value"
    return f"an integer {text}" if parameter.kind == "int" else text


def partition_parameter_field(rule: str, parameter: str) -> str:
    """The experiment form's field of ``rule``'s ``parameter`` (each rule's parameters have their
    own inputs: two rules may both take an ``alpha`` with different ranges or defaults)."""
    return f"partition-{rule}-{parameter}"


def aggregation_parameter_field(aggregator: str, parameter: str) -> str:
    """The experiment form's field of ``aggregator``'s ``parameter`` (each aggregator's
    parameters have their own inputs, as each partition rule's do)."""
    return f"aggregation-{aggregator}-{parameter}"


def _parameter_input(parameter: PartitionParameter, owner: str, data_attr: str) -> forms.Field:
    """A number input for a declared parameter of ``owner`` (a partition rule or an aggregator),
    with its range as the browser's limits and in its help text; a select of the allowed values
    for a switch or a name out of a list (an aggregator's ``bias_correction``, ``initial_v``)."""
    if not parameter.numeric:
        # Sent as the text chosen: the record's check reads "true"/"false" and the names.
        values = ["true", "false"] if parameter.kind == "bool" else list(parameter.choices)
        default = str(parameter.default).lower() if parameter.kind == "bool" else parameter.default
        return _input(
            _select(values, **{data_attr: owner}),
            parameter.label,
            help_text=f"{owner} only: {parameter.allowed}; default {default}",
            initial=default,
        )
    attrs: dict[str, Any] = {data_attr: owner}
    if parameter.kind == "int":
        attrs["step"] = 1
    if parameter.minimum is not None:
        attrs["min"] = parameter.minimum
    if parameter.maximum is not None:
        attrs["max"] = parameter.maximum
    return _input(
        _number(**attrs),
        parameter.label,
        help_text=f"{owner} only: {_range_text(parameter)}; blank: "
        + ("the default" if parameter.default is not None else "required"),
        initial=parameter.default,
    )


def _as_number(text: str, kind: str) -> Any:
    """What a JSON client would send for ``text`` typed into a number input: an int for an
    integer literal (``"0"``), a float otherwise (``"0.5"``, ``"1e3"``); for an ``int``
    parameter a float with no fraction (``"2.0"``) is sent as that int, one with a fraction as the
    float (the API then says it must be an integer). Text that is no number is sent as typed
    (the API says what is wrong)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if kind == "int" and value.is_integer() else value


class ExperimentForm(ApiCheckedForm):
    """Create an experiment from tasks and devices of the catalogue (``POST /api/experiments/``):
    every device holds a shard of every task's training data, chosen by an installed partition
    rule with its parameters (explicit sample counts per device and task are API-only).

    Each rule's declared parameters (its record's ``PartitionParameter``) get their own input,
    :func:`partition_parameter_field`; only the chosen rule's are sent (as ``partition_params``),
    so the form works without JavaScript, which only hides the other rules' inputs. The API's
    messages about ``partition_params.<name>`` show at the chosen rule's input of that name.
    The aggregator and its parameters work the same way (:func:`aggregation_parameter_field`,
    sent as ``aggregation_params``); per-task aggregator overrides are API and CLI only.
    """

    serializer_class = api.ExperimentCreateSerializer
    service_argument_names = {"tasks": "task_ids", "devices": "device_ids"}

    name = _input(forms.TextInput(attrs={"maxlength": 200, "autocomplete": "off"}), "Name")
    tasks = _input(forms.SelectMultiple(), "Tasks", help_text="Ctrl or ⌘ to pick several")
    devices = _input(forms.SelectMultiple(), "Devices", help_text="Ctrl or ⌘ to pick several")
    rounds = _input(_number(ROUNDS, step=1), "Rounds", initial=DEFAULT_ROUNDS)
    local_epochs = _input(_number(LOCAL_EPOCHS, step=1), "Local epochs", initial=1, help_text="per device and round")
    seed = _input(_number(min=0, step=1), "Seed", initial=0, help_text="of the split and the sample order")
    partition_rule = _input(
        _select([]), "Data split", initial="iid", help_text="installed partition rules; their parameters below"
    )
    lr_scaling = _input(
        _select(
            [
                ("none", "none: the task's learning rate at every batch size"),
                ("linear", "linear: × B/128 (Goyal et al. 2017)"),
                ("sqrt", "sqrt: × √(B/128) (Krizhevsky 2014)"),
            ]
        ),
        "Learning rate vs batch size",
        initial=DEFAULT_LR_SCALING,
        help_text="applied alike to every strategy; the planners change batch sizes",
    )
    untrusted_predictor = _input(
        _select(
            [
                ("plan", "plan anyway, with the warnings on the run"),
                ("baseline", "baseline: train the best baseline's plan instead"),
                ("measure", "measure: train the best baseline's plan in round 0, then replan from it"),
            ]
        ),
        "When a predictor is not trusted",
        initial="plan",
        help_text="what a vres_* run does when the planner's guard distrusts a device's predictor (held-out "
        "RMSLE above MTFL_PREDICTOR_MAX_RMSLE, or a mix it was not fitted on)",
    )
    aggregation = _input(
        _select([]),
        "Aggregation",
        initial="fedavg",
        help_text="how each task's device models become its next global model; its parameters below; per-task "
        "overrides: API (task_aggregation) or mtfl create-experiment --task-aggregation",
    )
    clients_per_round = _input(
        _number(min=1, step=1, placeholder="every device"),
        "Devices per round (optional)",
        help_text="partial participation: how many devices train each round; or a fraction, not both",
    )
    client_fraction = _input(
        _number(CLIENT_FRACTION, placeholder="every device"),
        "Fraction of devices per round (optional)",
        help_text=f"in {CLIENT_FRACTION.interval}, rounded up to at least one device",
    )
    client_sampling = _input(
        _select(
            [
                ("uniform", "uniform: every device equally likely"),
                ("weighted", "weighted: by each device's data volume"),
            ]
        ),
        "Drawing the devices",
        initial="uniform",
        help_text="seeded by the experiment's seed and the round, so runs draw the same devices",
    )
    keep_device_weights = _input(
        forms.CheckboxInput(),
        "Keep device weights",
        initial=False,
        help_text="for debugging: by default every device's weights are deleted once its round is aggregated",
    )
    keep_last_checkpoints = _input(
        _number(KEEP_LAST_CHECKPOINTS, step=1, placeholder="lab default"),
        "Checkpoints kept (optional)",
        help_text="global models kept per run and task: the last N rounds', besides the initial, the best and the "
        "latest (default MTFL_KEEP_LAST_CHECKPOINTS)",
    )
    description = _input(forms.Textarea(attrs={"rows": 2}), "Description (optional)")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        tasks = [(t.id, f"{t.name} ({t.architecture}, {t.dataset})") for t in experiment_selectors.task_list()]
        self.fields["tasks"].widget = _multi(tasks)
        self.fields["devices"].widget = _multi(_device_choices())
        # explicit sample counts are API-only (a table per device and task)
        _registered_select(
            self,
            "partition_rule",
            [(p.name, f"{p.label} · {PARTITIONER_REGISTRY.source(p.name)}") for p in PARTITIONER_REGISTRY.records()],
        )
        _registered_select(
            self,
            "aggregation",
            [(a.name, f"{a.label} · {AGGREGATOR_REGISTRY.source(a.name)}") for a in AGGREGATOR_REGISTRY.records()],
        )
        self.parameter_fields: dict[str, dict[str, tuple[str, PartitionParameter]]] = {}
        """rule → parameter name → (form field, its declaration)."""
        self.aggregation_fields: dict[str, dict[str, tuple[str, PartitionParameter]]] = {}
        """aggregator → parameter name → (form field, its declaration)."""
        # Each rule's parameters right after the partition rule, each aggregator's after the aggregator.
        later = {name: self.fields.pop(name) for name in list(self.fields)[list(self.fields).index("lr_scaling") :]}
        for rule in PARTITIONER_REGISTRY.records():
            for parameter in rule.parameters:
                field = partition_parameter_field(rule.name, parameter.name)
                self.fields[field] = _parameter_input(parameter, rule.name, "data-partition-rule")
                self.parameter_fields.setdefault(rule.name, {})[parameter.name] = (field, parameter)
        for name in ("lr_scaling", "untrusted_predictor", "aggregation"):
            self.fields[name] = later.pop(name)
        for aggregator in AGGREGATOR_REGISTRY.records():
            for parameter in aggregator.parameters:
                field = aggregation_parameter_field(aggregator.name, parameter.name)
                self.fields[field] = _parameter_input(parameter, aggregator.name, "data-aggregation")
                self.aggregation_fields.setdefault(aggregator.name, {})[parameter.name] = (field, parameter)
        self.fields.update(later)  # participation, then the description last

    def chosen_parameters(self) -> dict[str, tuple[str, PartitionParameter]]:
        """The chosen rule's parameters: name → (form field, declaration); empty for a rule
        without any (or one not installed: the API refuses it)."""
        return self.parameter_fields.get(str(self.cleaned_data.get("partition_rule") or "iid"), {})

    def chosen_aggregation_parameters(self) -> dict[str, tuple[str, PartitionParameter]]:
        """The chosen aggregator's parameters: name → (form field, declaration)."""
        return self.aggregation_fields.get(str(self.cleaned_data.get("aggregation") or "fedavg"), {})

    def clean(self) -> dict[str, Any]:
        chosen = self.chosen_parameters()
        # The API's messages name `partition_params.<name>` (or the rule's old `dirichlet_alpha`):
        # shown at the chosen rule's input; about `partition_params` as a whole, at the one
        # input when the rule takes one parameter, else at the rule.
        self.error_fields = {f"partition_params.{name}": field for name, (field, _) in chosen.items()}
        whole = next(iter(chosen.values()))[0] if len(chosen) == 1 else "partition_rule"
        self.error_fields["partition_params"] = whole
        if "alpha" in chosen:
            self.error_fields["dirichlet_alpha"] = chosen["alpha"][0]
        # `aggregation_params.<name>` at the chosen aggregator's input; as a whole, at the aggregator.
        for name, (field, _) in self.chosen_aggregation_parameters().items():
            self.error_fields[f"aggregation_params.{name}"] = field
        self.error_fields["aggregation_params"] = "aggregation"
        return super().clean()

    def payload(self) -> dict[str, Any]:
        data = {
            name: value
            for name, value in super().payload().items()
            if not name.startswith(("partition-", "aggregation-"))  # sent below, under *_params
        }
        for name in ("tasks", "devices"):
            data[name] = self.cleaned_data.get(name) or []
        params = {}
        for name, (field, parameter) in self.chosen_parameters().items():
            text = self.cleaned_data.get(field)
            if text is not None and str(text).strip() != "":
                params[name] = _as_number(str(text).strip(), parameter.kind)
        if params:
            data["partition_params"] = params
        aggregation_params = {}
        for name, (field, parameter) in self.chosen_aggregation_parameters().items():
            text = self.cleaned_data.get(field)
            if text is not None and str(text).strip() != "":
                aggregation_params[name] = _as_number(str(text).strip(), parameter.kind)
        if aggregation_params:
            data["aggregation_params"] = aggregation_params
        return data

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~controlplane.experiments.services.experiment_create`."""
        v = self.validated
        return {
            "name": v["name"],
            "description": v["description"],
            "task_ids": v["tasks"],
            "device_ids": v["devices"],
            "rounds": v["rounds"],
            "local_epochs": v["local_epochs"],
            "partition_rule": v["partition_rule"],
            "partition_params": v.get("partition_params") or {},
            "seed": v["seed"],
            "lr_scaling": v["lr_scaling"],
            "untrusted_predictor": v["untrusted_predictor"],
            "aggregation": v["aggregation"],
            "aggregation_params": v.get("aggregation_params") or {},
            "clients_per_round": v.get("clients_per_round"),
            "client_fraction": v.get("client_fraction"),
            "client_sampling": v["client_sampling"],
            "keep_device_weights": v["keep_device_weights"],
            "keep_last_checkpoints": v.get("keep_last_checkpoints"),
        }


class ExperimentFromTemplateForm(ApiCheckedForm):
    """The index page's "New experiment from a template" (``POST /api/experiments/from-template/``):
    template, devices, optionally a name and rounds."""

    serializer_class = api.ExperimentFromTemplateSerializer

    template = _input(_select([(t.name, f"{t.name}: {t.title}") for t in TEMPLATES.values()]), "Template")
    devices = _input(forms.SelectMultiple(), "Devices", help_text="Ctrl or ⌘ to pick several")
    name = _input(
        forms.TextInput(attrs={"placeholder": "default: <template> mix", "maxlength": MAX_NAME_LENGTH}),
        "Name (optional)",
    )
    rounds = _input(_number(ROUNDS, step=1, placeholder=f"default {DEFAULT_ROUNDS}"), "Rounds (optional)")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["devices"].widget = _multi([(d.id, d.name) for d in fleet_selectors.device_list()])

    def payload(self) -> dict[str, Any]:
        data = super().payload()
        data["devices"] = self.cleaned_data.get("devices") or []
        return data

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of
        :func:`~controlplane.experiments.services.templates.experiment_create_from_template`
        (fields left empty are left out, so the service's defaults apply)."""
        data = dict(self.validated)
        return {"template": data.pop("template"), "device_ids": data.pop("devices"), **data}


# --- runs, comparisons, members -----------------------------------------------------------------


def _name_value_items(text: str) -> list[str]:
    """``"a=1, b=2"`` → ``["a=1", "b=2"]`` (blank items dropped)."""
    return [item.strip() for item in text.split(",") if item.strip()]


def _objective_select(label: str) -> forms.Field:
    return _input(
        _select([("", "raw (default)"), ("raw", "raw: Σ P"), ("fair", "fair: Σ P / P_alone")]),
        label,
    )


class _AggregatorOverride(ApiCheckedForm):
    """The runs' own aggregator instead of the experiment's (``options.aggregation``), with its
    parameters typed as ``NAME=VALUE, ...`` (``options.aggregation_params``): FL algorithms then
    compare on the experiment's devices, data and seed. ``option_fields`` are the form's fields
    sent under ``options``."""

    option_fields: tuple[str, ...] = ("aggregation",)

    aggregation = _input(
        _select([]),
        "Aggregation (any strategy)",
        help_text="this run's instead of the experiment's: FL algorithms compared on the same devices, data and seed",
    )
    aggregation_params = _input(
        forms.TextInput(attrs={"placeholder": "e.g. server_learning_rate=0.01, beta1=0.9", "autocomplete": "off"}),
        "Aggregator parameters (optional)",
        help_text="NAME=VALUE, …; left-out ones take their defaults (mtfl plugins lists them)",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        _registered_select(
            self,
            "aggregation",
            # names only: the experiment form's select carries each aggregator's description
            [("", "the experiment's (default)")] + [(a.name, a.name) for a in AGGREGATOR_REGISTRY.records()],
        )

    def clean(self) -> dict[str, Any]:
        text = str(self.data.get("aggregation_params") or "").strip()
        bad = [item for item in _name_value_items(text) if "=" not in item or not item.partition("=")[0].strip()]
        if bad:
            # Said at its input, and the rest is still checked (every error at once): the
            # malformed text leaves cleaned_data with the message, so it is not sent.
            self.add_error(
                "aggregation_params",
                f"NAME=VALUE items separated by commas (e.g. server_learning_rate=0.01); got {bad[0]!r}",
            )
        return super().clean()

    def payload(self) -> dict[str, Any]:
        data = super().payload()
        options = {k: data.pop(k) for k in self.option_fields if k in data}
        text = str(data.pop("aggregation_params", "") or "").strip()
        if text:
            options["aggregation_params"] = {
                name.strip(): _as_number(value.strip(), "float")
                for name, _, value in (item.partition("=") for item in _name_value_items(text))
            }
        if options:
            data["options"] = options
        return data

    def _form_field(self, key: str) -> str | None:
        # `options.aggregation_params.<name>` (the API's and the service's messages): at the one input.
        return "aggregation_params" if key.startswith("options.aggregation_params") else super()._form_field(key)

    def add_service_error(self, exc: ApplicationError) -> None:
        if (exc.field or "").startswith("options.aggregation_params"):
            self.add_error("aggregation_params", exc.message)
            return
        super().add_service_error(exc)


MANUAL_PLAN_MAX_CELLS = 64
"""Up to this many device–task pairs the run form offers a ``manual`` plan's table; a bigger
experiment's plan is sent through the API (a table that size is no form)."""

_PLAN_CELL = re.compile(r"^plan\[(\d+)\](?:\.(batch_size|active_thread_percentage))?")


class RunForm(_AggregatorOverride):
    """Launch a run of a strategy (``POST /api/experiments/{id}/runs/``).

    For ``manual``, the plan is a table of a batch size and an MPS share per device and task
    holding data (inputs ``plan-<device>-<task>-batch_size`` and ``-active_thread_percentage``),
    sent as ``plan`` and checked by the same serializer and service as the API's: every bad
    cell is named at its input. The run may use its own aggregator (:class:`_AggregatorOverride`).
    """

    serializer_class = api.RunCreateSerializer
    option_fields = ("objective", "slack", "replan", "aggregation")
    field_order = ["strategy", "objective", "slack", "replan", "aggregation", "aggregation_params"]

    strategy = _input(_select([]), "Strategy", initial="sharing")
    objective = _objective_select("Objective (vres_greedy)")
    slack = _input(
        _select([("", "smaller_batches (default)"), ("smaller_batches", "smaller_batches"), ("none", "none")]),
        "Slack (vres_sync)",
    )
    replan = _input(
        _select(
            [
                ("", "every_round (default)"),
                ("every_round", "every_round: closed loop, from what it measured"),
                ("never", "never: the first plan in every round"),
            ]
        ),
        "Replanning (vres_*)",
    )

    def __init__(self, *args, experiment: Experiment | None = None, tasks: list | None = None, **kwargs) -> None:
        """``experiment``: the one the run is of (its manual plan's table); ``tasks``: its tasks
        when the caller has read them already."""
        super().__init__(*args, **kwargs)
        self.error_fields = {
            "options.objective": "objective",
            "options.slack": "slack",
            "options.replan": "replan",
            "options.aggregation": "aggregation",
            "options": "objective",
            "plan": "strategy",
        }
        _registered_select(self, "strategy", _registered(STRATEGY_REGISTRY))
        self.plan_rows: list[dict[str, Any]] = []
        """The manual plan's table: per device, ``{"device", "cells": [per task, None or
        {"task", "batch_size", "active_thread_percentage"} (bound fields)]}``."""
        self.plan_tasks: list[Any] = []
        self.plan_too_big = False
        self._plan_cells: list[tuple[int, int, str, str]] = []
        if experiment is not None:
            self._add_plan_cells(experiment, tasks)

    def _add_plan_cells(self, experiment: Experiment, tasks: list | None) -> None:
        """One batch size and one share input per device–task pair with data (none when there
        are more than :data:`MANUAL_PLAN_MAX_CELLS`)."""
        shards = experiment_selectors.experiment_shards(experiment)
        held = sorted(key for key, span in shards.items() if span.num_samples > 0)
        # The names of the devices holding data (of the first ones past the limit: the same
        # queries, bounded, whatever the experiment's size).
        named = sorted({device_id for device_id, _ in held})[: MANUAL_PLAN_MAX_CELLS + 1]
        devices = experiment_selectors.experiment_devices(experiment, device_ids=named, fields=["id", "name"])
        if len(held) > MANUAL_PLAN_MAX_CELLS:
            self.plan_too_big = True
            return
        self.plan_tasks = tasks if tasks is not None else experiment_selectors.experiment_tasks(experiment)
        for device_id, task_id in held:
            n = shards[(device_id, task_id)].num_samples
            names = [f"plan-{device_id}-{task_id}-{key}" for key in ("batch_size", "active_thread_percentage")]
            self.fields[names[0]] = _input(
                _number(
                    min=bound_text(BATCH_SIZE.low),
                    max=min(n, int(BATCH_SIZE.high)),
                    step=1,
                    placeholder=f"{bound_text(BATCH_SIZE.low)}–{min(n, int(BATCH_SIZE.high))}",
                    **{"data-plan-cell": "batch_size", "aria-label": f"batch size, device {device_id}, task {task_id}"},
                ),
                "Batch size",
            )
            self.fields[names[1]] = _input(
                _number(
                    ACTIVE_THREAD_PERCENTAGE,
                    step=1,
                    placeholder=ACTIVE_THREAD_PERCENTAGE.span,
                    **{"data-plan-cell": "share", "aria-label": f"share %, device {device_id}, task {task_id}"},
                ),
                "Share %",
            )
            self._plan_cells.append((device_id, task_id, *names))
        cells = {(d, t): (b, r) for d, t, b, r in self._plan_cells}
        for device in devices:
            row = []
            for task in self.plan_tasks:
                pair = cells.get((device.id, task.id))
                row.append(
                    None if pair is None else {"task": task, "batch_size": self[pair[0]], "share": self[pair[1]]}
                )
            self.plan_rows.append({"device": device, "cells": row})

    @property
    def plan_has_errors(self) -> bool:
        """Some input of the manual plan's table is refused (the page opens the table)."""
        return any(self.has_error(name) for _d, _t, *names in self._plan_cells for name in names)

    def clean(self) -> dict[str, Any]:
        for k, (_d, _t, batch, share) in enumerate(self._plan_cells):
            self.error_fields[f"plan[{k}].batch_size"] = batch
            self.error_fields[f"plan[{k}].active_thread_percentage"] = share
            self.error_fields[f"plan[{k}]"] = batch
        return super().clean()

    def probe_payload(self, payload: dict[str, Any], keys: set[str]) -> dict[str, Any]:
        # A refused cell of the plan is put at its lowest allowed value, so the service still
        # checks the others (a batch size larger than its shard is the service's to say).
        plan = [dict(entry) for entry in payload.get("plan") or []]
        cells = {key for key in keys if _PLAN_CELL.match(key) and _PLAN_CELL.match(key).group(2)}
        for key in cells:
            index, name = _PLAN_CELL.match(key).groups()
            if int(index) < len(plan):
                plan[int(index)][name] = int((BATCH_SIZE if name == "batch_size" else ACTIVE_THREAD_PERCENTAGE).low)
        if plan:
            payload["plan"] = plan
        return super().probe_payload(payload, keys - cells)

    def payload(self) -> dict[str, Any]:
        data = {k: v for k, v in super().payload().items() if not k.startswith("plan-")}
        if data.get("strategy") == "manual":
            # Every cell is sent, a blank one without its value, so the serializer names it.
            data["plan"] = []
            for device_id, task_id, batch, share in self._plan_cells:
                entry: dict[str, Any] = {"device": device_id, "task": task_id}
                for key, field in (("batch_size", batch), ("active_thread_percentage", share)):
                    text = str(self.cleaned_data.get(field) or "").strip()
                    if text:
                        entry[key] = _as_number(text, "int")
                data["plan"].append(entry)
        return data

    def add_service_error(self, exc: ApplicationError) -> None:
        cell = _PLAN_CELL.match(exc.message)
        if cell and int(cell.group(1)) < len(self._plan_cells):
            _d, _t, batch, share = self._plan_cells[int(cell.group(1))]
            self.add_error(share if cell.group(2) == "active_thread_percentage" else batch, exc.message)
            return
        super().add_service_error(exc)

    def probe_replace(
        self, exc: ApplicationError, service: Callable[..., Any], arguments: dict[str, Any], replaced: set[Any]
    ) -> bool:
        # The service names the first bad cell of a plan; the next call takes it at its lowest
        # allowed value, so every bad cell is named.
        cell = _PLAN_CELL.match(exc.message)
        if cell and cell.group(2) and arguments.get("plan") and (cell.groups() not in replaced):
            plan = [dict(entry) for entry in arguments["plan"]]
            index = int(cell.group(1))
            if index < len(plan):
                low = BATCH_SIZE.low if cell.group(2) == "batch_size" else ACTIVE_THREAD_PERCENTAGE.low
                plan[index][cell.group(2)] = int(low)
                arguments["plan"] = plan
                replaced.add(cell.groups())
                return True
        return super().probe_replace(exc, service, arguments, replaced)

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~controlplane.experiments.services.run_create` (less the experiment)."""
        v = self.validated or {}
        return {"strategy": v["strategy"], "plan": v.get("plan"), "options": v.get("options")}


class CompareForm(_AggregatorOverride):
    """Compare chosen strategies on an experiment (``POST /api/experiments/{id}/compare/``):
    which strategies (the baseline, ``temporal``, required: every speedup is taken against it),
    how many repeats, the test accuracy each task's time to accuracy is taken to (inputs
    ``target-<task id>``; blank: the lowest final accuracy any run reaches), the planner's
    objective, and an aggregator for every run (:class:`_AggregatorOverride`)."""

    serializer_class = api.ComparisonCreateSerializer
    option_fields = ("objective", "aggregation")
    field_order = ["strategies", "repeats", "objective", "aggregation", "aggregation_params"]

    strategies = _input(forms.CheckboxSelectMultiple(), "Strategies")
    chosen = _input(forms.HiddenInput(), "", initial="1")
    """Set by the page's form: its strategies are the ticked ones (none ticked: refused). A bare
    POST without it compares every strategy, as the page's former button did."""
    repeats = _input(
        _number(REPEATS, step=1),
        "Repeats",
        initial=1,
        help_text=f"{REPEATS.span}: every strategy that many times, in interleaved orders; from 2, figures get "
        "95 % intervals",
    )
    objective = _objective_select("Objective (vres_greedy)")

    def __init__(self, *args, experiment: Experiment | None = None, tasks: list | None = None, **kwargs) -> None:
        """``experiment``: the one compared (a target input per task); ``tasks``: its tasks when
        the caller has read them already."""
        super().__init__(*args, **kwargs)
        baseline = baseline_strategy().name
        self.fields["strategies"].widget.choices = [
            (s.name, f"{s.name} (the baseline: required)" if s.name == baseline else s.name)
            for s in STRATEGY_REGISTRY.records()
            if not s.takes_plan
        ]
        self.fields["strategies"].initial = list(compared_strategies())
        self.fields["strategies"].help_text = (
            f"run one after another on the same devices, data and seeds; {baseline} is required: every speedup "
            "is taken against it"
        )
        self.fields["aggregation"].label = "Aggregation (every run)"
        self.fields["aggregation"].help_text = "every run's instead of the experiment's"
        self.error_fields = {
            "options.objective": "objective",
            "options.aggregation": "aggregation",
            "options": "objective",
        }
        self.target_fields: list[str] = []
        if tasks is None:
            tasks = experiment_selectors.experiment_tasks(experiment) if experiment is not None else []
        for task in tasks:
            name = f"target-{task.id}"
            self.fields[name] = _input(
                _number(TARGET_ACCURACY, placeholder="lowest final accuracy"),
                f"Target accuracy of {task.name}",
                help_text=f"test accuracy in {TARGET_ACCURACY.interval}; blank: the lowest final accuracy any run reaches",
            )
            self.target_fields.append(name)
            self.error_fields[f"targets.{task.id}"] = name

    def payload(self) -> dict[str, Any]:
        data = {k: v for k, v in super().payload().items() if not k.startswith("target-") and k != "chosen"}
        if self.cleaned_data.get("chosen"):
            data["strategies"] = self.cleaned_data.get("strategies") or []
        else:
            data.pop("strategies", None)
        targets = {}
        for name in self.target_fields:
            text = str(self.cleaned_data.get(name) or "").strip()
            if text:
                targets[name.removeprefix("target-")] = _as_number(text, "float")
        if targets:
            data["targets"] = targets
        return data

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~controlplane.experiments.services.comparison_create`
        (less the experiment)."""
        v = self.validated or {}
        return {
            "strategies": v.get("strategies"),
            "repeats": v["repeats"],
            "targets": v.get("targets"),
            "options": v.get("options"),
        }


# --- profiling and predictors ---------------------------------------------------------------------


class ProfileForm(ApiCheckedForm):
    """Start a profiling sweep on a device (``POST /api/devices/{id}/profile/``, ``mtfl
    profile``): co-located mixes of the tasks' models (or the default models) measured for a
    time budget, which a predictor is then fitted on."""

    serializer_class = api.ProfileSweepCreateSerializer

    device = _input(_select([]), "Device", help_text="its agent runs the sweep; no round gets it meanwhile")
    budget_s = _input(_number(SWEEP_BUDGET_SELF_SERVE, step=1), "Budget (s)", initial=300)
    tasks = _input(
        forms.SelectMultiple(),
        "Tasks (optional)",
        help_text=f"their models at each task's classes and input shape; none: {', '.join(DEFAULT_ARCHITECTURES)}",
    )

    def __init__(self, *args, user: Any = None, **kwargs) -> None:
        """``user``: who starts the sweep; the budget's input offers the range they may give
        (:func:`~controlplane.profiling.services.sweeps.sweep_budget_limit`)."""
        super().__init__(*args, **kwargs)
        low, high = sweep_budget_limit(user)
        self.fields["budget_s"].widget = _number(min=bound_text(low), max=bound_text(high), step=1)
        self.fields["budget_s"].help_text = f"seconds of measuring, {bound_text(low)} to {bound_text(high)}" + (
            "" if is_lab_staff(user) else f" (lab staff: up to {bound_text(SWEEP_BUDGET.high)})"
        )
        self.fields["device"].widget = _select([("", "choose a device")] + _device_choices())
        tasks = [(t.id, f"{t.name} ({t.architecture})") for t in experiment_selectors.task_list()]
        self.fields["tasks"].widget = _multi(tasks)
        self.device = None

    def payload(self) -> dict[str, Any]:
        data = {k: v for k, v in super().payload().items() if k != "device"}
        if self.cleaned_data.get("tasks"):
            data["tasks"] = self.cleaned_data["tasks"]
        else:
            data.pop("tasks", None)
        return data

    def clean(self) -> dict[str, Any]:
        chosen = str(self.cleaned_data.get("device") or "")
        # The device is the API's URL, not a field of its body: looked up here, among the fleet's.
        self.device = fleet_selectors.device_list().filter(pk=int(chosen)).first() if chosen.isdigit() else None
        if self.device is None:
            known = ", ".join(d.name for d in fleet_selectors.device_list()[:20]) or "none registered"
            self.add_error("device", f"choose a registered device ({known})")
        cleaned = super().clean()
        if self.device is None:
            self.validated = None  # the service needs a device: it is not asked
        return cleaned

    def service_arguments(self) -> dict[str, Any]:
        """Keyword arguments of :func:`controlplane.experiments.services.sweeps.sweep_start`."""
        v = self.validated or {}
        return {"device": self.device, "budget_s": v["budget_s"], "tasks": v.get("tasks")}


class PredictorFitForm(ApiCheckedForm):
    """Fit a throughput predictor on a device class's profile samples (``POST /api/predictors/``,
    ``mtfl fit-predictor``); the control worker fits it and its page shows the held-out error."""

    serializer_class = api.PredictorCreateSerializer

    backend = _input(_select([]), "Backend")
    device_class = _input(
        _select([]),
        "Device class",
        help_text="its samples are what the predictor learns from (a device class: the backend and its resources)",
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        sampled = profiling_selectors.sampled_device_classes()
        _registered_select(self, "backend", _registered(BACKEND_REGISTRY))
        self.fields["device_class"].widget = _select(
            [("", "the only class with samples")]
            + [(c["device_class"], f"{c['device_class']} ({c['backend']}, {c['samples']} samples)") for c in sampled]
        )
        # Default: the class profiled last (what a researcher who just ran a sweep fits).
        self.fields["backend"].initial = sampled[0]["backend"] if sampled else "cpu"
        self.fields["device_class"].initial = sampled[0]["device_class"] if sampled else ""
        self.sampled = sampled


class CollaboratorsForm(ApiCheckedForm):
    """The owner's list of collaborators (``PATCH /api/experiments/{id}/`` with ``collaborators``):
    user names that replace the current ones."""

    serializer_class = api.ExperimentUpdateSerializer
    serializer_kwargs = {"partial": True}

    collaborators = _input(
        forms.TextInput(attrs={"placeholder": "user names, e.g. carol, dave", "autocomplete": "off"}),
        "Collaborators",
        help_text="user names, separated by commas or spaces; empty: shared with no one",
    )

    @classmethod
    def for_experiment(cls, experiment: Experiment) -> CollaboratorsForm:
        """The form filled in with the experiment's current collaborators."""
        names = sorted(u.username for u in experiment.collaborators.all())
        return cls(initial={"collaborators": ", ".join(names)})

    def payload(self) -> dict[str, Any]:
        text = self.cleaned_data.get("collaborators") or ""
        return {"collaborators": [name for name in re.split(r"[\s,]+", text) if name]}
