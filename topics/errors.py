"""One root exception; each stage sorts failures into retriable, poison (dead-letter) and fatal."""


class ParleyError(Exception):
    """Root of every error Parley raises on purpose."""


class RetriableError(ParleyError):
    """A dependency is briefly unavailable: retry with backoff, do not commit the offset."""


class FatalError(ParleyError):
    """The stage cannot go on (bad configuration, lost storage): stop and let the supervisor restart it."""


class PoisonEvent(ParleyError, ValueError):
    """A record that cannot be decoded or processed: it goes to the dead-letter topic, the stage keeps running."""
