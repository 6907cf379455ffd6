"""Server-sent events as the tests read them: the one parser (replay/sse.py) the eval runner uses too."""

from replay.sse import iter_sse

__all__ = ["iter_sse"]
