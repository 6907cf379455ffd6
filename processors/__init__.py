"""Stream processors (faust-streaming agents): moderation, scheduling, persistence, metering."""
