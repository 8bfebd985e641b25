"""``LLM``: load a model (checkpoint directory, bundled model or preset) and generate."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

from nonstop.config import ConfigError, ModelConfig, preset_names
from nonstop.engine.core import EngineCore
from nonstop.engine.requests import Request, RequestOutput
from nonstop.engine.sampling import SamplingParams
from nonstop.engine.spec.config import SpecConfig, make_drafter
from nonstop.engine.spec.step import SpecDecoder
from nonstop.engine.tokenizer import Tokenizer
from nonstop.runtime import make_executor, resolve_backend

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_MODEL = "k3-nano"
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def parse_dtype(dtype, device: str) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def bundled_models() -> list[str]:
    return sorted(p.parent.name for p in ASSETS.glob("*/config.json"))


def resolve_model(model: str | Path) -> tuple[ModelConfig, Path | None]:
    """(config, checkpoint dir) for a directory, a bundled model name, or a preset (dir None: random weights)."""
    path = Path(model)
    if path.is_dir():
        return ModelConfig.from_file(path), path
    if (ASSETS / str(model) / "config.json").exists():
        return ModelConfig.from_file(ASSETS / str(model)), ASSETS / str(model)
    if str(model) in preset_names():
        return ModelConfig.preset(str(model)), None
    if path.exists():
        raise ConfigError(f"{path} is not a directory: give the checkpoint directory (holding config.json)")
    raise ConfigError(f"model {str(model)!r} is neither a checkpoint directory nor a known name; bundled: {', '.join(bundled_models()) or 'none'}; presets (random weights): {', '.join(preset_names())}")


def _eos_ids(cfg: ModelConfig, model_dir: Path | None) -> frozenset[int]:
    ids = set(cfg.eos_token_ids)
    if model_dir is not None and (model_dir / "generation_config.json").exists():
        eos = json.loads((model_dir / "generation_config.json").read_text()).get("eos_token_id")
        ids |= set(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return frozenset(ids)


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch.device, or a ValueError saying why this machine cannot use it."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a device torch knows: {exc}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but this torch ({torch.__version__}) sees no CUDA GPU; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} asked for, but only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif dev.type != "cpu":
        raise ValueError(f"device {device!r} is not supported: use cpu or cuda[:N]")
    return dev


class LLM:
    """A loaded model ready to generate.

    model: checkpoint directory (HF ``config.json`` + safetensors), a bundled model (``k3-nano``) or a
    preset name (random weights). dtype: ``auto`` (fp32 on CPU, bf16 on CUDA) or a torch dtype / name.
    backend: ``auto`` (``cpu`` on a CPU, else ``reference``) | ``reference`` | ``superop`` | ``megakernel`` |
    ``cpu`` | ``cpu-bf16`` | ``cpu-int8`` (``nonstop.runtime.cpu``: 16- / 8-bit weights).
    max_batch: sequences decoded together.
    prefill_chunk: prompt tokens per prefill forward (None: whole prompts). batch_invariant: each
    sequence in a forward of its own, so its tokens do not depend on the others (see ``EngineCore``).
    speculative: ``{"method": "ngram" | "dspark", "num_tokens": k, ...}`` (``SpecConfig``): draft k
    tokens per step and verify them in one forward; outputs stay exactly those of plain decoding
    (greedy; sampling: exactly distributed), and each output's metrics gain drafted_tokens,
    accepted_tokens, verify_steps and mean_accepted_length (tokens per verification step).
    """

    def __init__(self, model: str | Path = DEFAULT_MODEL, dtype=None, device: str = "cpu", backend: str = "auto", max_batch: int = 16, seed: int = 0, speculative: dict | None = None, progress: bool = False, prefill_chunk: int | None = None, batch_invariant: bool = False):
        from nonstop.model.build import load_model, random_model

        self.device = check_device(device)
        self.dtype = parse_dtype(dtype, str(device))
        self.cfg, self.model_dir = resolve_model(model)
        self.name = str(model)
        if self.model_dir is None:
            print(f"nonstop: {model!r} is a preset: using random weights (seed {seed})", file=sys.stderr)
            self.model = random_model(self.cfg, self.dtype, self.device, seed)
        else:
            report = _progress_printer(f"loading {self.model_dir}") if progress else None
            self.model = load_model(self.cfg, self.model_dir, self.dtype, self.device, report)
        self.tokenizer = Tokenizer.load(self.model_dir, self.cfg.vocab_size)
        self.eos_ids = _eos_ids(self.cfg, self.model_dir)
        self.backend = resolve_backend(backend, self.device)
        self.executor = make_executor(self.backend, self.model)
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.batch_invariant = batch_invariant
        self.speculative = SpecConfig.parse(speculative)
        self.drafter = make_drafter(self.speculative, self.model, self.model_dir) if self.speculative else None
        self._ids = itertools.count()

    # ------------------------------------------------------------------ requests
    def make_request(self, prompt: str | None, prompt_ids: list[int] | None, params: SamplingParams, request_id: str | None = None) -> Request:
        if prompt_ids is None:
            if not isinstance(prompt, str):
                raise TypeError(f"prompts must be strings, got {type(prompt).__name__}")
            prompt_ids = self.tokenizer.encode(prompt)
        else:
            prompt_ids = [int(t) for t in prompt_ids]
            bad = [t for t in prompt_ids if not 0 <= t < self.cfg.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.cfg.vocab_size - 1})")
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        return Request(request_id or str(next(self._ids)), prompt, prompt_ids, params, self.eos_ids)

    def new_core(self, num_slots: int, isolate_errors: bool = False, max_len: int | None = None) -> EngineCore:
        """An ``EngineCore`` with ``num_slots`` slots and this LLM's prefill chunk and batch invariance."""
        spec = SpecDecoder(self.speculative, self.drafter) if self.speculative else None
        return EngineCore(self.cfg, self.executor, self.tokenizer, num_slots, self.dtype, self.device, max_len=max_len, prefill_chunk=self.prefill_chunk, batch_invariant=self.batch_invariant, isolate_errors=isolate_errors, speculative=spec)

    def generate(self, prompts=None, sampling: SamplingParams | list[SamplingParams] | None = None, prompt_token_ids=None) -> list[RequestOutput]:
        """Generate for each prompt (strings) or each token-id list; one RequestOutput per prompt, in order."""
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompts or prompt_token_ids")
        if prompts is not None:
            items = [(p, None) for p in ([prompts] if isinstance(prompts, str) else list(prompts))]
        else:
            ids = list(prompt_token_ids)
            if ids and isinstance(ids[0], int):
                ids = [ids]
            items = [(None, list(x)) for x in ids]
        if not items:
            return []
        params = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(items)
        if len(params) != len(items):
            raise ValueError(f"got {len(params)} SamplingParams for {len(items)} prompts")
        requests = [self.make_request(p, ids, sp) for (p, ids), sp in zip(items, params)]
        core = self.new_core(min(self.max_batch, len(requests)))
        for req in requests:
            core.check_length(req)
        pending = list(requests)
        while pending or core.active:
            while pending and core.has_free_slot:
                core.admit(pending.pop(0))
            core.step()
        return [r.output() for r in requests]


def _progress_printer(label: str):
    """Progress on stderr: a rewritten line on a terminal, only the final line otherwise."""
    state = {"last": -1}
    tty = sys.stderr.isatty()

    def report(done: int, total: int) -> None:
        if not tty and done != total:
            return
        pct = 100 * done // total
        if pct // 10 != state["last"] // 10 or done == total:
            state["last"] = pct
            print(f"\r{label}: {pct:3d}% ({done}/{total} tensors)", end="\n" if done == total else "", file=sys.stderr, flush=True)

    return report
