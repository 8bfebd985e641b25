"""Auxiliary-loss-free expert balancing (DeepSeek-V3 style) for the MoE layers during training.

The router selects experts by s + b (``gate.e_score_correction_bias`` b, selection only, no gradient;
see ``nonstop.model.moe.route``). After every optimizer step, for each MoE layer with per-expert
load c_e (tokens routed to e in the step, summed over the step's forward passes):
  b_e ← b_e + γ · sign(mean(c) − c_e)
so under-loaded experts become more likely to be picked and over-loaded ones less.

Loads are counted by a forward hook on each ``MoE`` module that re-runs the model's own ``route`` on
the module input (a [N, d] × [d, E] product; cheap next to the experts).
"""

from __future__ import annotations

import torch

from nonstop.model.moe import MoE, route


def bias_update(bias: torch.Tensor, load: torch.Tensor, rate: float) -> None:
    """In place: bias [E] += rate · sign(mean(load) − load), load [E] (token counts)."""
    load = load.float()
    bias.add_(rate * torch.sign(load.mean() - load).to(bias.dtype))


def load_spread(load: torch.Tensor) -> float:
    """max(load) / mean(load) of one layer: 1.0 is perfect balance, E / top_k means every token picks the same
    experts."""
    load = load.float()
    return float(load.max() / load.mean().clamp_min(1e-9))


def _spreads(loads: dict[str, torch.Tensor]) -> dict[str, float]:
    """``load_spread`` of each layer that counted any token (an empty count has no spread, not 0)."""
    return {name: load_spread(load) for name, load in loads.items() if load.sum() > 0}


class ExpertBalancer:
    """Counts expert loads of every ``MoE`` module of ``model`` and nudges their correction biases."""

    def __init__(self, model: torch.nn.Module, rate: float = 1e-3):
        self.rate = rate
        self.moes = {name: m for name, m in model.named_modules() if isinstance(m, MoE)}
        self.loads = {name: torch.zeros(m.cfg.num_experts) for name, m in self.moes.items()}
        self.total = {name: torch.zeros(m.cfg.num_experts) for name, m in self.moes.items()}
        self.recent = {name: torch.zeros(m.cfg.num_experts) for name, m in self.moes.items()}
        self._last_recent: dict[str, float] = {}  # recent_spreads' last non-empty window
        self._hooks = [m.register_forward_hook(self._counter(name)) for name, m in self.moes.items()]
        for m in self.moes.values():
            m.gate.e_score_correction_bias.requires_grad_(False)

    def _counter(self, name: str):
        def hook(module: MoE, inputs, output) -> None:
            if not module.training:
                return
            with torch.no_grad():
                x = inputs[0].reshape(-1, inputs[0].shape[-1])
                _, ids = route(x, module.gate.weight, module.gate.e_score_correction_bias, module.cfg)
                self.loads[name] += torch.bincount(ids.flatten().cpu(), minlength=module.cfg.num_experts).float()

        return hook

    def step(self) -> None:
        """Apply the bias update for the loads counted since the last call, then reset the counts."""
        with torch.no_grad():
            for name, m in self.moes.items():
                bias_update(
                    m.gate.e_score_correction_bias,
                    self.loads[name].to(m.gate.e_score_correction_bias.device),
                    self.rate,
                )
                self.total[name] += self.loads[name]
                self.recent[name] += self.loads[name]
                self.loads[name].zero_()

    def spreads(self) -> dict[str, float]:
        """max/mean expert load per MoE layer over the whole run (layers with no token counted left out)."""
        return _spreads(self.total)

    def recent_spreads(self) -> dict[str, float]:
        """max/mean expert load per MoE layer over the steps since the last call, then the recent counts
        restart; with no step since, the last call's (an empty window has no spread)."""
        if any(load.sum() > 0 for load in self.recent.values()):
            self._last_recent = _spreads(self.recent)
            for load in self.recent.values():
                load.zero_()
        return dict(self._last_recent)

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()
