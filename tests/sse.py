"""Server-sent events as the tests read them: the one parser (replay/sse.py) the eval runner and benches use too."""

from replay.sse import aiter_sse, iter_sse, shown

__all__ = ["aiter_sse", "iter_sse", "shown"]
