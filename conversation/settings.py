"""How a chat's context is assembled and remembered: the verbatim window, the summary, recall, and when the
memory stage summarises (docs/decisions/0008-conversation-memory.md). Settings of every process that builds
or remembers a context (PARLEY_* like the rest); the per-pool budgets are the pools' (runtime/settings.py)."""

from __future__ import annotations

from runtime.settings import StackSettings


class ContextSettings(StackSettings):
    # the context the scheduler assembles
    recent_messages: int = 160  # the most messages after the summary read for the verbatim window
    system_prompt: str = "You are Parley, a helpful assistant. Answer clearly and concisely."
    # how long to wait for the previous answer to be persisted before going on
    prev_turn_wait_s: float = 3.0
    # memory (docs/decisions/0008-conversation-memory.md); the budgets are per pool (runtime/settings.py Pool)
    summary_tokens: int = 256  # the most a summary may take in a prompt
    # reserved in a prompt for retrieved messages (at most a fifth of the budget)
    recall_tokens: int = 320
    recall_item_tokens: int = 120  # the most one retrieved message may take
    # the most messages recalled per new message (the reserve's tokens bound them too)
    recall_k: int = 6
    # nearest messages read from the vector index, from which recall chooses
    recall_candidates: int = 16
    # cosine below this is not relevant enough to spend tokens on
    recall_min_similarity: float = 0.35
    # MMR: 1 ranks by relevance alone; lower prefers messages unlike those chosen
    recall_diversity: float = 0.4
    # a person's memories across chats (docs/decisions/0024-memories-across-chats.md): the nearest read, the
    # most recalled into one prompt, the tokens they may take there, and the cosine below which one is left out
    memories_candidates: int = 8
    memories_k: int = 3
    memories_tokens: int = 120
    memories_min_similarity: float = 0.3
    # a chat's documents (docs/decisions/0027-documents-in-a-chat.md): the tokens their passages may take in a
    # prompt (all of them when they fit, else the nearest), and the nearest read from the vector index
    documents_tokens: int = 600
    documents_candidates: int = 12
    memory_pool: str = "small"  # the pool summaries run on
    summarize_after_tokens: int = 768  # unsummarised tokens after the summary that start a new one
    # the newest tokens a summary leaves out (the verbatim window keeps them)
    summarize_keep_tokens: int = 256
    summary_max_tokens: int = 160  # a summary run's answer
    summary_timeout_s: float = 180.0  # a summary run not back by then is tried again
