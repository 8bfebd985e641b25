"""Second-pass gap in ``generation_config``: a ``max_new_tokens`` equal to the model's context leaves no room
for even a one-token prompt and must be refused, naming the file; one less is accepted."""

from __future__ import annotations

import json

import pytest

from nonstop.config import ModelConfig
from nonstop.engine.generation_config import load_generation_config
from nonstop.weights.errors import CheckpointError
from tests.engine.tiny_models import TINY_MODELS


def test_max_new_tokens_filling_the_context_is_refused(tmp_path):
    """max_new_tokens == context: refused (a ``>`` check would accept it and fail every request later)."""
    cfg = ModelConfig.from_file(TINY_MODELS["k3"])
    context = cfg.max_position_embeddings
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": context}))
    with pytest.raises(CheckpointError, match="max_new_tokens"):
        load_generation_config(tmp_path, cfg)
    (tmp_path / "generation_config.json").write_text(json.dumps({"max_new_tokens": context - 1}))
    assert load_generation_config(tmp_path, cfg).defaults == {"max_tokens": context - 1}
