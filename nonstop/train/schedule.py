"""Learning rate over a wall-clock budget: linear warmup by steps, cosine decay by elapsed time.

  lr(step, p) = peak · (step + 1) / warmup                             while step < warmup
              = min + (peak − min) · ½ (1 + cos(π · min(p, 1)))        afterwards
with p = elapsed / budget measured from the end of warmup (so the decay always spans the rest of
the budget, however long warmup took on a busy machine).
"""

from __future__ import annotations

import math


def learning_rate(step: int, progress: float, peak: float, minimum: float, warmup_steps: int) -> float:
    """lr for optimizer step ``step`` (0-based) at decay progress ``progress`` ∈ [0, 1]."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return minimum + (peak - minimum) * 0.5 * (1.0 + math.cos(math.pi * p))
