"""How much of a MoE stack's logit error comes from routing flips (random routers), on the CPU in fp32.

The first GPU run (``bench/results/op_check_nvidia-h200_*.json``) found every super-op's kernel within 1.2e-2 of
its twin, yet the MoE slices' whole steps off the reference by 0.18 (Kimi K3's 4 layers) and 0.22 (kimi-linear's
9). This script asks whether op errors of that size can do it through the router alone: a random router's
top-k boundary sits between near-equal scores, so a small change of the hidden state swaps an expert.

The reference model (random weights, the preset's layers cut to ``--layers``, its router and hidden width kept,
each routed expert narrowed to ``--expert-intermediate`` so it fits in CPU memory) runs one forward over
``--tokens`` tokens three ways per noise level ε and seed:

  clean                   y = x Wᵀ in every linear (the routers' fp32 logits are never perturbed directly)
  noisy                   y + ε · rms(y) · N(0, 1) after every linear: an op error of relative size ε
  noisy, routing forced   the same noise, every router's top-k set replaced by the clean run's (weights from
                          the noisy scores of those experts): what the error would be without flips

and, with ``--bf16``, the model cast to bf16 (its own rounding the noise, as the GPU check's bf16 steps) free and
forced; it reports the tokens x MoE layers whose top-k set changed and each run's logit error against the clean one
(max |a - b| / max |b|, bench/decode.py's ``rel_err``). JSON to ``--out`` (default
``bench/results/routing_sensitivity_cpu_<model>.json``; a --dry-run writes only to --out, else to ``$OUT`` when
set, else to the temporary directory, never to bench/results).

    python bench/routing_sensitivity.py                           # kimi-linear-48b-a3b, 9 layers (~1 min)
    python bench/routing_sensitivity.py --model kimi-k3 --layers 4
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from script_args import check_out, non_negative_float, out_file, positive_int, results_path  # bench/ is on sys.path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default="kimi-linear-48b-a3b",
        help="a MoE preset or checkpoint directory (default kimi-linear-48b-a3b)",
    )
    ap.add_argument("--layers", type=positive_int, default=9, help="first layers kept (default 9, the GPU slice's)")
    ap.add_argument("--expert-intermediate", type=positive_int, default=64, help="routed expert width (default 64)")
    ap.add_argument("--vocab", type=positive_int, default=4096, help="vocabulary kept (default 4096)")
    ap.add_argument("--tokens", type=positive_int, default=24, help="tokens in the forward (default 24)")
    ap.add_argument("--eps", default="0.003,0.01", help="relative op errors, comma-separated (default 3e-3, 1e-2)")
    ap.add_argument("--seeds", type=positive_int, default=2, help="noise seeds per level (default 2)")
    ap.add_argument("--bf16", action="store_true", help="also the model in bf16 against fp32 (no injected noise)")
    ap.add_argument(
        "--dry-run", action="store_true", help="the model's narrow twin, 2 layers (a test; writes no bench/results)"
    )
    ap.add_argument(
        "--out",
        type=out_file,
        default=None,
        help="JSON path (default bench/results/routing_sensitivity_cpu_<model>.json; a --dry-run: $OUT or the "
        "temporary directory)",
    )
    args = ap.parse_args(argv)
    try:
        args.eps = [non_negative_float(e) for e in args.eps.split(",")]
    except argparse.ArgumentTypeError:
        ap.error(f"--eps takes comma-separated numbers >= 0, got {args.eps!r}")
    try:
        args.config = bench_config(args)
        args.out = check_out(args.out or default_out(args))
    except ValueError as exc:  # ConfigError too: an unknown model, more layers than it has
        ap.error(str(exc))
    return args


def default_out(args) -> Path:
    """Where the JSON goes without --out: bench/results, or for a dry run ``$OUT`` or the temporary directory."""
    name = f"routing_sensitivity_cpu_{Path(args.model).name}{'_dry-run' if args.dry_run else ''}.json"
    if not args.dry_run:
        return results_path(name)
    return Path(os.environ.get("OUT") or tempfile.gettempdir()) / name


def bench_config(args):
    """The model ``args`` ask for, cut and narrowed; a ValueError for an unknown model or one without routed
    experts."""
    from nonstop.program.twin import narrow_twin
    from nonstop.runtime.gpucheck import config_of

    cfg = config_of(args.model, 2 if args.dry_run else args.layers)
    if cfg.moe is None:
        raise ValueError(f"{args.model} has no routed experts")
    if args.dry_run:
        return narrow_twin(cfg)
    moe = dataclasses.replace(cfg.moe, intermediate_size=args.expert_intermediate)
    return dataclasses.replace(cfg, vocab_size=min(args.vocab, cfg.vocab_size), moe=moe)


class Perturbation:
    """Noise after every linear and a record / override of every router's choice, while ``active``."""

    def __init__(self):
        self.eps, self.gen = 0.0, None
        self.record: list | None = None
        self.force: list | None = None
        self.calls = 0

    @contextmanager
    def active(self, eps: float, seed: int, record: bool = False, force: list | None = None):
        import torch
        import torch.nn.functional as F

        from nonstop.model import moe

        linear, select = F.linear, moe.select_experts
        self.eps, self.gen = eps, torch.Generator().manual_seed(seed)
        self.record, self.force, self.calls = ([] if record else None), force, 0

        def noisy_linear(x, weight, bias=None):
            y = linear(x, weight, bias)
            if self.eps:
                y = y + torch.randn(y.shape, generator=self.gen, dtype=y.dtype) * self.eps * y.pow(2).mean().sqrt()
            return y

        def routed(logits, bias, cfg):
            weights, ids = select(logits, bias, cfg)
            if self.record is not None:
                self.record.append(ids.clone())
            if self.force is not None:  # the clean run's experts, weighted by this run's scores of them
                ids = self.force[self.calls]
                scores = torch.sigmoid(logits) if cfg.scoring == "sigmoid" else torch.softmax(logits, dim=-1)
                weights = scores.gather(1, ids)
                if cfg.renormalize:
                    weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
                weights = weights * cfg.routed_scaling_factor
            self.calls += 1
            return weights, ids

        F.linear, moe.select_experts = noisy_linear, routed
        try:
            yield self
        finally:
            F.linear, moe.select_experts = linear, select


def changed_sets(routes: list, clean: list) -> int:
    """Tokens x routers whose top-k set differs from the clean run's."""
    return sum(int((a.sort(-1).values != b.sort(-1).values).any(-1).sum()) for a, b in zip(routes, clean))


def _row(p: Perturbation, run, clean, clean_routes, label: dict) -> dict:
    """One noise source: ``run(force)`` the forward under ``p`` (routing free when ``force`` is None)."""
    from decode import rel_err

    free = run(None)
    flips = changed_sets(p.record, clean_routes)
    forced = run(clean_routes)
    row = {
        **label,
        "changed_topk_sets": flips,
        "rel_err_free_routing": rel_err(free, clean),
        "rel_err_routing_forced": rel_err(forced, clean),
    }
    what = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in label.items())
    print(
        f"{what}: top-k sets changed {flips}/{sum(r.shape[0] for r in clean_routes)}; logit error "
        f"{row['rel_err_free_routing']:.4f} free, {row['rel_err_routing_forced']:.4f} with the clean routing",
        flush=True,
    )
    return row


def measure(model, ids, eps_levels, seeds: int, half=None) -> tuple[list[dict], int]:
    """Rows per (eps, seed), and with ``half`` (the same model in bf16) one with its rounding as the noise."""
    import torch

    p = Perturbation()
    with torch.no_grad():
        with p.active(0.0, 0, record=True):
            clean = model(ids)[0]
        clean_routes = p.record
        rows = []
        for eps in eps_levels:
            for seed in range(1, seeds + 1):

                def noisy(force, eps=eps, seed=seed):
                    with p.active(eps, seed, record=force is None, force=force):
                        return model(ids)[0]

                rows.append(_row(p, noisy, clean, clean_routes, {"eps": eps, "seed": seed}))
        if half is not None:

            def rounded(force):
                with p.active(0.0, 0, record=force is None, force=force):
                    return half(ids)[0]

            rows.append(_row(p, rounded, clean, clean_routes, {"noise": "bf16 weights and activations"}))
    return rows, sum(r.shape[0] for r in clean_routes)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    from nonstop.hostinfo import write_result
    from nonstop.model.build import random_model

    cfg = args.config
    start = time.time()
    model = random_model(cfg, torch.float32)
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    print(
        f"{args.model}: {cfg.num_hidden_layers} layers, {cfg.moe.num_experts} experts top-{cfg.moe.top_k}, "
        f"hidden {cfg.hidden_size}, built in {time.time() - start:.1f} s",
        flush=True,
    )
    # the same random weights rounded to bf16; routers, A_log and dt_bias stay fp32 as a loaded checkpoint's do
    half = random_model(cfg, torch.bfloat16) if args.bf16 else None
    rows, slots = measure(model, ids, args.eps, args.seeds, half)
    fields = {
        "model": args.model,
        "dry_run": args.dry_run,
        "layers": cfg.num_hidden_layers,
        "hidden": cfg.hidden_size,
        "experts": cfg.moe.num_experts,
        "top_k": cfg.moe.top_k,
        "expert_intermediate": cfg.moe.intermediate_size,
        "tokens": args.tokens,
        "router_calls_x_tokens": slots,
        "rows": rows,
    }
    return write_result(args.out, "routing_sensitivity", fields)


if __name__ == "__main__":
    from script_args import run

    run(main)
