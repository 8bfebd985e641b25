"""``nonstop info``: parameters, bytes per decode token, cache per token, layer types; for a checkpoint
directory, its safetensors headers checked as loading checks them (no weight is read)."""

from __future__ import annotations

from nonstop.commands.common import DTYPE_CHOICES
from nonstop.config import ModelConfig


def add_parser(sub) -> None:
    p = sub.add_parser(
        "info",
        help="describe a model: parameters, bytes per token, layers",
        description=(
            "Describe a model without loading its weights: total and active parameters, weight bytes read per decoded "
            "token (batch 1), attention-cache bytes per token, recurrent state per sequence, and a table of layer "
            "types. For a checkpoint directory, the safetensors headers are checked against the config first (every "
            "tensor present, of its shape and dtype, each file whole), so a broken download fails here."
        ),
    )
    p.add_argument("--model", "-m", default="k3-nano", help="checkpoint directory, bundled model or preset")
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPE_CHOICES,
        help="weight dtype to count bytes in (default bfloat16)",
    )
    p.add_argument("--list", action="store_true", help="list bundled models and presets")
    p.set_defaults(run=run)


def run(args) -> int:
    from nonstop.commands.common import human
    from nonstop.config import preset_names
    from nonstop.program.footprint import model_footprint
    from nonstop.weights.resolve import DTYPES, bundled_models, resolve_model

    if args.list:
        print("bundled:", ", ".join(bundled_models()) or "(none)")
        print("presets:", ", ".join(preset_names()))
        return 0
    cfg, model_dir = resolve_model(args.model)
    fp = model_footprint(cfg, DTYPES[args.dtype])  # first: a model the engine cannot build (int4 experts) says so
    checked = check_headers(cfg, model_dir) if model_dir is not None else None
    moe = cfg.moe
    print(f"model        {args.model} ({cfg.family}{', random weights' if model_dir is None else ''})")
    if checked:
        print(f"checkpoint   {checked}")
        print(f"tokenizer    {tokenizer_text(model_dir)}")
    print(
        f"shape        hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, vocab {cfg.vocab_size}"
        + (
            f", {moe.num_experts} experts top-{moe.top_k}"
            + (f" (latent {moe.latent_size})" if moe.latent_size else "")
            + (f", {moe.expert_format} experts" if moe.expert_format != "dense" else "")
            if moe
            else ""
        )
    )
    print(f"parameters   {parameters_text(cfg, fp)}")
    print(
        f"weights      {human(fp.weight_bytes, 'B')} in {args.dtype}; read per decode token (batch 1): "
        f"{human(fp.bytes_per_token, 'B')}"
    )
    print(
        f"cache        {human(fp.cache_bytes_per_token, 'B')} per token (attention), "
        f"{human(fp.state_bytes_per_sequence, 'B')} per sequence (KDA state)"
    )
    print()
    print(f"{'attention':<10} {'ffn':<6} {'count':>5}  layers")
    for attn, ffn, count, spans in layer_table(cfg):
        print(f"{attn:<10} {ffn:<6} {count:>5}  {spans}")
    return 0


def parameters_text(cfg: ModelConfig, fp) -> str:
    """Total and active parameters, saying whether active counts the embedding table: a tied table is the LM
    head, a matmul every token, and is counted; an untied one is only looked up (a row per token) and is not,
    as ``program.footprint`` counts them."""
    from nonstop.commands.common import human

    total, active, embedding = human(fp.total_params), human(fp.active_params), human(fp.embedding_params)
    if cfg.tie_word_embeddings:
        return f"total {total}, active {active} per token, including the {embedding} embedding (tied: the LM head)"
    return f"total {total}, active {active} per token, not counting the {embedding} embedding (a row lookup per token)"


def tokenizer_text(model_dir) -> str:
    """The tokenizer file a checkpoint directory's text is encoded with (the first the loader takes), or how
    to drive a checkpoint without one."""
    from nonstop.engine.tokenizer import TOKENIZER_FILES

    found = next((name for name in TOKENIZER_FILES if (model_dir / name).exists()), None)
    return found or "none: prompts and outputs are token ids (generate --prompt-ids 1,2,3 --ids, prompt_token_ids)"


def check_headers(cfg: ModelConfig, model_dir) -> str:
    """Check the checkpoint in ``model_dir`` against ``cfg`` from its safetensors headers alone, as loading
    would (CheckpointError: a missing, unexpected, misshapen or truncated tensor, a corrupt file or index);
    say what was checked."""
    from nonstop.weights.loader import check_tensor, resolve_checkpoint

    located, resolved, fp8_block = resolve_checkpoint(cfg, model_dir)
    for spec, names in resolved:
        for name in names:
            check_tensor(name, spec, located, fp8_block)
    files = {f.path for f in located.values()}
    return f"{len(located)} tensors in {len(files)} safetensors file{'s' * (len(files) != 1)}, headers checked"


def layer_table(cfg: ModelConfig) -> list[tuple[str, str, int, str]]:
    """One row per (attention kind, FFN kind): (attention, ffn, count, layer indices as ranges)."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(cfg.attn_types, cfg.mlp_types)):
        groups.setdefault(key, []).append(i)
    rows = []
    for (attn, ffn), layers in groups.items():
        spans, start = [], layers[0]
        for prev, cur in zip(layers, layers[1:] + [None]):
            if cur != prev + 1 if cur is not None else True:
                spans.append(f"{start}" if prev == start else f"{start}-{prev}")
                start = cur
        rows.append((attn, ffn, len(layers), ", ".join(spans)))
    return rows
