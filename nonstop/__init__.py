"""nonstop: decode hybrid-attention MoE models (Kimi K3 family first) non-stop.

Public API: ``from nonstop import LLM, SamplingParams``.
"""

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name):
    # Lazy so that `import nonstop.config` stays light (no torch import) for tools that only parse configs.
    if name == "LLM":
        from nonstop.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from nonstop.engine.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(name)
