"""generation_config.json defaults: checks a mutation audit found missing (values from the module's contract)."""

from __future__ import annotations

import json

from nonstop.engine.generation_config import load_generation_config


def _load(tmp_path, fields: dict):
    (tmp_path / "generation_config.json").write_text(json.dumps(fields))
    return load_generation_config(tmp_path)


def test_do_sample_false_means_greedy_only_without_a_temperature(tmp_path):
    assert _load(tmp_path, {"do_sample": False}).defaults == {"temperature": 0.0}
    # a temperature in the file is kept, as vLLM reads it (the module's docstring)
    assert _load(tmp_path, {"do_sample": False, "temperature": 0.7}).defaults == {"temperature": 0.7}


def test_request_fields_override_the_files_defaults(tmp_path):
    gen = _load(tmp_path, {"temperature": 0.7, "top_k": 20, "max_new_tokens": 9})
    params = gen.sampling(temperature=0.0, top_k=None)
    assert (params.temperature, params.top_k, params.max_tokens) == (0.0, 20, 9)
