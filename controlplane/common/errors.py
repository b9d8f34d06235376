"""The control plane's own error type, rendered by the API like a validation error."""

from __future__ import annotations


class ApplicationError(Exception):
    """A request that cannot be carried out, with a message a researcher can act on.

    Args:
        message: one line saying what is wrong and what is allowed.
        field: the input field at fault, if one is (the API reports it under that name).
        status_code: HTTP status the API answers with (400 unless the state forbids it: 409).
    """

    def __init__(self, message: str, *, field: str | None = None, status_code: int = 400):
        super().__init__(message)
        self.message = message
        self.field = field
        self.status_code = status_code

    def as_dict(self) -> dict[str, list[str]]:
        """Return ``{field: [message]}`` (``non_field_errors`` when no field is named)."""
        return {self.field or "non_field_errors": [self.message]}
