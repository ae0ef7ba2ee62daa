"""One exception hierarchy.  Every error carries a message a person can act on."""

from __future__ import annotations


class K3Error(Exception):
    """Base of every error k3desk reports to a person.

    ``message`` says what went wrong, naming the file or thing concerned;
    ``hint`` says what to do about it.  Neither contains a traceback.
    """

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}\n  {self.hint}" if self.hint else self.message


class Cancelled(K3Error):
    """The operation was cancelled by the user."""

    def __init__(self, message: str = "Cancelled.") -> None:
        super().__init__(message)


class HardwareError(K3Error):
    """A hardware profile could not be read or is malformed."""


class CatalogError(K3Error):
    """The tier catalog is malformed or a tier id is unknown."""


class ValidationError(K3Error):
    """A GGUF shard set is incomplete, inconsistent or not a Kimi-K3 model."""


class PlanError(K3Error):
    """No launch plan can be made from the given inputs."""


class EngineError(K3Error):
    """The inference engine could not be found, built, started or kept running."""


class HubError(K3Error):
    """A download from the Hugging Face Hub failed."""


class ChatError(K3Error):
    """A chat request failed."""
