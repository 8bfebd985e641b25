"""A checkpoint's ``generation_config.json``: its end-of-sequence ids and default sampling.

As vLLM does, the sampling fields become the defaults of requests that do not set them:
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``max_new_tokens``
(-> ``max_tokens``). As transformers reads it, ``do_sample: false`` without a temperature means greedy
(temperature 0); with a temperature the temperature wins and requests sample, as in vLLM (transformers would
decode greedily). Other fields are ignored. A field of the wrong type or range, or a file that is not a
JSON object, is a ``CheckpointError`` naming the file and the field; so are, against the model's config,
a bos / eos id outside its vocabulary (such an eos is never sampled) and a ``max_new_tokens`` that leaves
no room for a prompt in its context. That default is refused, not clipped: vLLM clips a default to the
room each prompt leaves, which nonstop does not do per request, and clipping it to the context here would
only move the failure to every request, without naming this file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nonstop.config import ModelConfig
from nonstop.config_parse import is_token_id, outside_vocabulary
from nonstop.engine.sampling import InvalidSamplingParam, SamplingParams
from nonstop.jsonfile import read_json_object
from nonstop.weights.errors import CheckpointError
from nonstop.weights.safetensors_file import unreadable

FILE = "generation_config.json"
SAMPLING_FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


@dataclass(frozen=True)
class GenerationConfig:
    eos_token_ids: frozenset[int] = frozenset()
    defaults: dict = field(default_factory=dict)  # SamplingParams field -> value
    path: Path | None = None

    def sampling(self, **overrides) -> SamplingParams:
        """SamplingParams with these defaults, ``overrides`` (those not None) on top."""
        return SamplingParams(**{**self.defaults, **{k: v for k, v in overrides.items() if v is not None}})


def load_generation_config(model_dir: Path | None, cfg: ModelConfig | None = None) -> GenerationConfig:
    """The checkpoint's generation config (empty when the file is absent or ``model_dir`` is None), checked
    against ``cfg`` (None: the checkpoint's config.json, when it has one)."""
    path = Path(model_dir) / FILE if model_dir is not None else None
    why = unreadable(path) if path is not None else None
    if why:
        raise CheckpointError(f"{path}: cannot read ({why})")
    if path is None or not path.exists():
        return GenerationConfig()
    raw = read_json_object(path, CheckpointError)
    if cfg is None and (path.parent / "config.json").exists():
        cfg = ModelConfig.from_file(path.parent)
    eos = raw.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(is_token_id(i) for i in eos_list):
        raise CheckpointError(f"{path}: eos_token_id must be a token id or a list of them, got {eos!r}")
    bos = raw.get("bos_token_id")
    if bos is not None and not is_token_id(bos):
        raise CheckpointError(f"{path}: field 'bos_token_id' must be a token id (an integer >= 0), got {bos!r}")
    if raw.get("do_sample") is not None and not isinstance(raw["do_sample"], bool):
        raise CheckpointError(f"{path}: field 'do_sample' must be true or false, got {raw['do_sample']!r}")
    defaults = {ours: raw[theirs] for theirs, ours in SAMPLING_FIELDS.items() if raw.get(theirs) is not None}
    if raw.get("do_sample") is False and "temperature" not in defaults:
        defaults["temperature"] = 0.0
    try:
        SamplingParams(**defaults)
    except InvalidSamplingParam as exc:
        theirs = next((k for k, v in SAMPLING_FIELDS.items() if v == exc.param), exc.param)
        raise CheckpointError(f"{path}: field {theirs!r}: {exc}") from None
    if cfg is not None:
        _check_against_model(path, cfg, eos_list, bos, defaults.get("max_tokens"))
    return GenerationConfig(frozenset(eos_list), defaults, path)


def _check_against_model(path: Path, cfg: ModelConfig, eos: list, bos: int | None, max_tokens: int | None) -> None:
    """CheckpointError for a bos / eos id outside ``cfg``'s vocabulary, or a max_new_tokens that fills its
    context (no prompt of one token would fit beside it)."""
    why = outside_vocabulary({"eos_token_id": eos, "bos_token_id": [bos]}, cfg.vocab_size)
    if why:
        raise CheckpointError(f"{path}: {why}")  # vocab_size: the model's config.json
    context = cfg.max_position_embeddings
    if max_tokens is not None and max_tokens >= context:
        raise CheckpointError(
            f"{path}: field 'max_new_tokens' is {max_tokens}, which leaves no room for a prompt in the model's "
            f"context of {context} tokens: lower it to {context - 1} or less (or remove it)"
        )
