"""Inference consumers: pull scheduled runs as fast as the engine has room, stream coalesced token deltas."""
