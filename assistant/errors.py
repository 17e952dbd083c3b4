"""Assistant errors (all raised; each also a ValueError, so callers that catch bad input keep working).

    AssistantError
    ├── DraftInputError     the diagnosis or remediation file given to the assistant is missing or invalid
    └── BackendConfigError  a model backend is asked for without the settings it needs
"""


class AssistantError(Exception):
    """Base of all assistant errors."""


class DraftInputError(AssistantError, ValueError):
    """The diagnosis or a remediation file is missing or not what the assistant reads."""


class BackendConfigError(AssistantError, ValueError):
    """The openai backend is asked for without an endpoint or model settings."""
