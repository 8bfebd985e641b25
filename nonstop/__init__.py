"""nonstop: decode hybrid-attention MoE models (Kimi K3 family first) non-stop.

Public API: ``from nonstop import LLM, SamplingParams`` (and ``DistributedLLM``, rank 0's ``LLM`` under a
multi-rank layout: docs/distributed.md).
"""

__version__ = "0.1.0"

__all__ = ["DistributedLLM", "LLM", "SamplingParams", "__version__"]


def __getattr__(name):
    # Lazy so that `import nonstop.config` stays light (no torch import) for tools that only parse configs.
    if name == "LLM":
        from nonstop.engine.llm import LLM

        return LLM
    if name == "DistributedLLM":
        from nonstop.engine.distributed_llm import DistributedLLM

        return DistributedLLM
    if name == "SamplingParams":
        from nonstop.engine.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(name)
