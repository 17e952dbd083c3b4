"""Service errors.

    IngestError     a request the service refuses: its HTTP status and the field that is wrong
"""


class IngestError(ValueError):
    """A document the service refuses: `status` is the HTTP status, `field` what is wrong."""

    def __init__(self, status: int, message: str, field: str = "") -> None:
        super().__init__(message)
        self.status, self.message, self.field = status, message, field
