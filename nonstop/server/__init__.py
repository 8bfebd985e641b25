"""OpenAI-compatible HTTP server over the continuous-batching engine loop.

``build_context(llm, ...)`` makes the engine loop and limits for a loaded ``LLM``; ``create_app``
makes the FastAPI app; ``serve`` runs it with uvicorn (what ``nonstop serve`` does).
"""

from nonstop.server.app import ServingContext, create_app
from nonstop.server.launch import build_context, serve

__all__ = ["ServingContext", "build_context", "create_app", "serve"]
