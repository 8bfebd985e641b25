"""A checkpoint's ``generation_config.json``: its end-of-sequence ids and default sampling.

As vLLM does, the sampling fields become the defaults of requests that do not set them:
``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty`` and ``max_new_tokens``
(-> ``max_tokens``). As transformers reads it, ``do_sample: false`` without a temperature means greedy
(temperature 0). Other fields are ignored. A field of the wrong type or range, or a file that is not a
JSON object, is a ``CheckpointError`` naming the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nonstop.engine.sampling import InvalidSamplingParam, SamplingParams
from nonstop.jsonfile import read_json_object
from nonstop.weights.errors import CheckpointError

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


def load_generation_config(model_dir: Path | None) -> GenerationConfig:
    """The checkpoint's generation config (empty when the file is absent or ``model_dir`` is None)."""
    if model_dir is None or not (Path(model_dir) / FILE).exists():
        return GenerationConfig()
    path = Path(model_dir) / FILE
    raw = read_json_object(path, CheckpointError)
    eos = raw.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else [] if eos is None else [eos]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in eos_list):
        raise CheckpointError(f"{path}: eos_token_id must be a token id or a list of them, got {eos!r}")
    defaults = {ours: raw[theirs] for theirs, ours in SAMPLING_FIELDS.items() if raw.get(theirs) is not None}
    if raw.get("do_sample") is False and "temperature" not in defaults:
        defaults["temperature"] = 0.0
    try:
        SamplingParams(**defaults)
    except InvalidSamplingParam as exc:
        theirs = next((k for k, v in SAMPLING_FIELDS.items() if v == exc.param), exc.param)
        raise CheckpointError(f"{path}: field {theirs!r}: {exc}") from None
    return GenerationConfig(frozenset(eos_list), defaults, path)
