"""The ``superop`` executor: a decode step as one call per super-op of the model's Program.

With ``use_kernels`` every op is one Triton launch (``nonstop/kernels``); without, each op runs its
plain-torch twin (``program/reference.py``) - the same program, used to test the decomposition on
any machine. Steps of more than ``program.max_rows`` rows (long prefills) and cache-free scoring run
the reference model; decode and speculative verification (1..16 rows) run the program.
"""

from __future__ import annotations

import torch

from nonstop.cache.state import ModelCache, StepBatch
from nonstop.model.stack import CausalLM
from nonstop.program.lower import lower
from nonstop.program.reference import REFERENCE, StepEnv


def kernel_table() -> dict:
    from nonstop.kernels import KERNELS

    return KERNELS


class SuperOpExecutor:
    name = "superop"

    def __init__(self, model: CausalLM, use_kernels: bool = True):
        self.model = model
        self.program = lower(model)
        if use_kernels:
            table = kernel_table()
            missing = sorted({op.kind for op in self.program.ops} - set(table))
            if missing:
                raise ValueError(f"backend 'superop' has no Triton kernel yet for: {', '.join(missing)}")
            self.impl = table
        else:
            self.impl = REFERENCE
        self.stats = {"launches_per_step": len(self.program.ops), "program_steps": 0, "reference_steps": 0}

    def run_program(self, input_ids: torch.Tensor, cache: ModelCache, batch: StepBatch) -> torch.Tensor:
        """One step through the program: logits [B, T, V] (fp32)."""
        B, T = input_ids.shape
        env = StepEnv(self.program.allocate(B * T, input_ids.device), cache, batch)
        env.buf["ids"].copy_(input_ids.reshape(-1))
        for op in self.program.ops:
            self.impl[op.kind](op, env)
        return env.buf["logits"].view(B, T, -1)

    def forward(self, input_ids: torch.Tensor, cache: ModelCache | None, batch: StepBatch | None, last_only: bool = False) -> torch.Tensor:
        if cache is None or input_ids.numel() > self.program.max_rows:
            self.stats["reference_steps"] += 1
            return self.model(input_ids, cache, batch, last_only=last_only)
        self.stats["program_steps"] += 1
        logits = self.run_program(input_ids, cache, batch)
        return logits[:, -1] if last_only else logits
