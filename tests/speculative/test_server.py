"""``nonstop serve --speculative ngram``: completions (whole and streamed) equal plain greedy decoding."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from nonstop import LLM, SamplingParams  # noqa: E402
from tests.engine.tiny_models import synth_checkpoint  # noqa: E402
from tests.server.conftest import MODEL_NAME, start_server, stop_server  # noqa: E402


def test_serve_with_speculative_decoding(tmp_path):
    model_dir = synth_checkpoint("k3", tmp_path / "tiny-k3")
    prompt = "abcabcabcabcab"
    want = LLM(model_dir, batch_invariant=True).generate([prompt], SamplingParams(max_tokens=10, temperature=0))[0].text
    server = start_server(model_dir, tmp_path, "--speculative", "ngram", "--num-draft-tokens", "3")
    try:
        client = server.client()
        whole = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0)
        streamed = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0, stream=True)
        assert whole.choices[0].text == want
        assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == want
    finally:
        stop_server(server)
