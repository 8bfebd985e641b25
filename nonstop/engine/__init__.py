"""The user-facing engine: LLM API, sampling, requests, batching, speculative decoding."""
