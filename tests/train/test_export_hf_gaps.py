"""What ``nonstop train`` exports (``save_checkpoint``) read by transformers and by nonstop itself: the
weights load in ``from_pretrained`` with no load report and the same fp32 logits, the copied tokenizer
encodes and decodes text as transformers' AutoTokenizer does, and the generation_config.json it writes is
one nonstop's own loader accepts for a model of a short context."""

from __future__ import annotations

import copy
import io
import logging

import pytest
import torch
import transformers

from nonstop.config import ModelConfig
from nonstop.engine.generation_config import load_generation_config
from nonstop.engine.tokenizer import Tokenizer
from nonstop.model.build import load_model
from nonstop.train.export import save_checkpoint
from nonstop.train.trainer import init_model
from nonstop.weights.resolve import ASSETS
from tests.tiny_configs import DEEPSEEK, KIMI_LINEAR_RELEASE, LLAMA

TOKENIZER = ASSETS / "k3-nano"
VOCAB = 6144  # the bundled tokenizer's
TEXTS = [
    "Hello, world!",
    "  leading spaces and\ttabs\nnewlines\n\n",
    "ünïcödé — “quotes” 日本語 🙂",
    "The quick brown fox.\r\nCRLF",
    "",
    " ",
    "def f(x):\n    return x ** 2  # square",
]


def _cfg(raw: dict, positions: int = 512) -> ModelConfig:
    raw = copy.deepcopy(raw)
    raw.update(vocab_size=VOCAB, max_position_embeddings=positions, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    if raw["model_type"] == "deepseek_v3":  # yarn needs original <= max positions, else transformers warns
        raw["rope_scaling"] = {**raw["rope_scaling"], "original_max_position_embeddings": positions // 4}
    return ModelConfig.from_hf_dict(raw)


def _trained(cfg: ModelConfig) -> torch.nn.Module:
    torch.manual_seed(4)
    model = init_model(cfg, seed=3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.mark.parametrize("raw", [LLAMA, DEEPSEEK, KIMI_LINEAR_RELEASE], ids=["llama", "deepseek_v3", "kimi_linear"])
def test_a_trained_export_loads_in_transformers_with_the_same_logits(raw, tmp_path):
    """Catches an export whose names, shapes or side files transformers reads differently (a LOAD REPORT of
    missing / unexpected weights, an expert unstacked in the wrong order): transformers on the fp32 export
    gives the trained model's own logits, and so does nonstop on the same file."""
    cfg = _cfg(raw)
    model = _trained(cfg)
    save_checkpoint(model, tmp_path, tokenizer_dir=TOKENIZER, dtype=torch.float32)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logging.getLogger("transformers").addHandler(handler)
    try:
        ref = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path, dtype=torch.float32, experts_implementation="eager"
        ).eval()
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert "LOAD REPORT" not in buf.getvalue(), buf.getvalue()
    ids = torch.tensor([transformers.AutoTokenizer.from_pretrained(tmp_path).encode("The Python interpreter")])
    with torch.no_grad():
        theirs = ref(ids).logits.float()
        for ours in (model, load_model(cfg, tmp_path, torch.float32)):
            assert float((ours(ids) - theirs).abs().max() / theirs.abs().max()) < 1e-5


def test_the_exported_tokenizer_round_trips_text_as_transformers_does(tmp_path):
    """Catches a tokenizer copied without its config (special tokens, no added bos) or read by nonstop
    differently from transformers: the same ids for every text, and both decode them back to the text."""
    save_checkpoint(_trained(_cfg(LLAMA)), tmp_path, tokenizer_dir=TOKENIZER)
    ours = Tokenizer.load(tmp_path, VOCAB)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (0, 1, 2)
    for text in TEXTS:
        ids = theirs.encode(text, add_special_tokens=False)
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == theirs.decode(ids) == text


@pytest.mark.parametrize("positions", [64, 40])
def test_the_export_of_a_short_context_model_loads_in_nonstop(positions, tmp_path):
    """DEFECT (fails on the code as audited): save_checkpoint writes max_new_tokens 64 whatever the model's
    context, and nonstop's own loader refuses a max_new_tokens that leaves no room for a prompt, so
    ``nonstop train --config`` with max_position_embeddings <= 64 exits 2 at its sample generations and
    leaves a checkpoint ``nonstop generate`` refuses. The written value must fit the context (at most
    positions - 1)."""
    cfg = _cfg(LLAMA, positions=positions)
    save_checkpoint(_trained(cfg), tmp_path, tokenizer_dir=TOKENIZER)
    gen = load_generation_config(tmp_path, cfg)  # raises CheckpointError on the audited code
    assert 0 < gen.defaults["max_tokens"] < positions
