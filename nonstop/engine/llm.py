"""``LLM``: load a model (checkpoint directory, bundled model or preset) and generate."""

from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
import time
from pathlib import Path

from nonstop.engine.chat_template import chat_prompt, check_messages
from nonstop.engine.core import EngineCore, check_fits
from nonstop.engine.generation_config import GenerationConfig, load_generation_config
from nonstop.engine.inputs import (
    check_flag,
    check_max_batch,
    check_prefill_chunk,
    id_list,
    prompt_id_lists,
    prompt_list,
)
from nonstop.engine.requests import Request, RequestOutput
from nonstop.engine.sampling import InvalidSamplingParam, SamplingParams
from nonstop.engine.speculative.config import SpeculativeConfig, drafter_dir, make_drafter
from nonstop.engine.speculative.step import SpeculativeDecoder
from nonstop.engine.tokenizer import Tokenizer
from nonstop.program.preflight import check_memory
from nonstop.runtime import make_executor, resolve_backend
from nonstop.threads import set_threads
from nonstop.weights.resolve import DEFAULT_MODEL, check_device, parse_dtype, resolve_model

PENALTIES_OFF = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}  # the neutral values


def checked_arguments(max_batch, prefill_chunk, seed, batch_invariant, generation_config, preflight, progress):
    """The constructor arguments an ``LLM`` (or a ``DistributedLLM``) takes as given, checked: a count in range,
    a seed that is an int, flags that are bools (``batch_invariant="no"`` would otherwise switch it on).
    Returns (max_batch, prefill_chunk, batch_invariant, generation_config, preflight, progress)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an integer, got {type(seed).__name__} {seed!r}")
    flags = {"batch_invariant": batch_invariant, "generation_config": generation_config}
    flags.update(preflight=preflight, progress=progress)
    counts = (check_max_batch(max_batch), check_prefill_chunk(prefill_chunk))
    return (*counts, *(check_flag(value, name) for name, value in flags.items()))


class LLM:
    """A loaded model ready to generate.

    model: checkpoint directory (HF ``config.json`` + safetensors), a bundled model (``k3-nano``) or a
    preset name (random weights). dtype: ``auto`` (fp32 on CPU, bf16 on CUDA) or a torch dtype / name.
    backend: ``auto`` (``cpu`` on a CPU, else ``reference``) | ``reference`` | ``superop`` | ``megakernel`` |
    ``cpu`` | ``cpu-bf16`` | ``cpu-int8`` (``nonstop.runtime.cpu``: 16- / 8-bit weights; its compiled step stays
    loaded in the process after the LLM is gone: build one LLM and reuse it).
    max_batch: sequences decoded together (an integer >= 1).
    prefill_chunk: prompt tokens per prefill forward (an integer >= 1; None: whole prompts). batch_invariant: each
    sequence in a forward of its own, so its tokens do not depend on the others (see ``EngineCore``).
    speculative: ``{"method": "ngram" | "dspark", "num_tokens": k, ...}`` (``SpeculativeConfig``): draft k
    tokens per step and verify them in one forward; outputs stay exactly those of plain decoding
    (greedy; sampling: exactly distributed), and each output's metrics gain drafted_tokens,
    accepted_tokens, verify_steps and mean_accepted_length (tokens per verification step).
    tokenizer: ``auto`` (the checkpoint's tokenizer.json or tiktoken.model; without one, text prompts
    are refused and token ids are used as they are), ``ids`` or ``bytes`` (``engine/tokenizer``).
    seed: the random weights of a preset (sampling is seeded per request: ``SamplingParams(seed=...)``;
    unseeded requests differ from run to run).
    chat_template: a jinja file replacing the checkpoint's, or the template text itself (a string holding
    ``{{`` or ``{%``, as vLLM takes either). generation_config: use the checkpoint's
    generation_config.json as the default sampling (``default_sampling``; under speculative decoding without
    its repetition penalty, which speculative decoding does not support). preflight: refuse a model larger than the
    free memory before allocating it (``program/preflight``). before_load: ``before_load(llm)`` is called
    once the config, tokenizer (with its chat template) and generation defaults are known and before any
    weight is read or built, for a caller's checks that need no weights (``nonstop chat``: its template).
    threads: torch's intra-op CPU threads, for the whole process (``nonstop.threads.set_threads``, the CLI's
    ``--threads``; None: ``NONSTOP_THREADS``, else the ``cpu`` backend sets one per physical core less the cores
    other processes keep busy, for the process too, when it is built).
    """

    def __init__(
        self,
        model: str | Path = DEFAULT_MODEL,
        dtype=None,
        device: str = "cpu",
        backend: str = "auto",
        max_batch: int = 16,
        seed: int = 0,
        speculative: dict | None = None,
        progress: bool = False,
        prefill_chunk: int | None = None,
        batch_invariant: bool = False,
        tokenizer: str = "auto",
        chat_template: str | Path | None = None,
        generation_config: bool = True,
        preflight: bool = True,
        before_load=None,
        threads: int | None = None,
    ):
        from nonstop.model.build import load_model, random_model

        max_batch, prefill_chunk, batch_invariant, generation_config, preflight, progress = checked_arguments(
            max_batch, prefill_chunk, seed, batch_invariant, generation_config, preflight, progress
        )
        self.device = check_device(device)
        if threads is not None:
            set_threads(check_max_batch(threads, "threads"))
        self._resolve(model, dtype, device, tokenizer, chat_template, generation_config)
        self.speculative_config = SpeculativeConfig.parse(speculative)  # a bad option fails before the weights load
        if self.speculative_config is not None and self.speculative_config.method == "dspark":
            drafter_dir(self.speculative_config, self.model_dir)
        if before_load is not None:
            before_load(self)
        if preflight:
            check_memory(self.name, self.cfg, self.dtype, self.device, max_batch)
        if self.model_dir is None:
            print(
                f"nonstop: {model!r} is a preset: using random weights (seed {seed}) and byte tokens", file=sys.stderr
            )
            self.model = random_model(self.cfg, self.dtype, self.device, seed)
        else:
            report = _progress_printer(f"loading {self.model_dir}") if progress else None
            self.model = load_model(self.cfg, self.model_dir, self.dtype, self.device, report)
        if not self.tokenizer.accepts_text:
            why = f"{self.model_dir} has no tokenizer"
            if tokenizer == "ids":
                why = "tokenizer 'ids' chosen (--tokenizer ids)"
            print(f"nonstop: {why}: prompts must be token ids and outputs are token ids only", file=sys.stderr)
        self.backend = resolve_backend(backend, self.device)
        self.executor = make_executor(self.backend, self.model)
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.batch_invariant = batch_invariant
        self.drafter = (
            make_drafter(self.speculative_config, self.model, self.model_dir) if self.speculative_config else None
        )
        self._ids = itertools.count()

    def _resolve(self, model, dtype, device, tokenizer: str, chat_template, generation_config: bool) -> None:
        """What every rank-0 engine knows before it builds weights: dtype, config, checkpoint directory,
        tokenizer (with its chat template), generation defaults and end-of-sequence ids; and the lock that runs
        its calls one at a time (an executor's step buffers serve one call: threads sharing an LLM take turns)."""
        self._calls = threading.RLock()  # re-entrant: a callback that generates again runs, rather than hangs
        self.dtype = parse_dtype(dtype, str(device))
        self.cfg, self.model_dir = resolve_model(model)
        self.name = str(model)
        self.tokenizer = Tokenizer.load(self.model_dir, self.cfg.vocab_size, tokenizer, chat_template)
        self.generation = load_generation_config(self.model_dir, self.cfg) if generation_config else GenerationConfig()
        self.eos_ids = frozenset(self.cfg.eos_token_ids) | self.generation.eos_token_ids

    def sampling_defaults(self) -> dict:
        """The checkpoint's generation_config.json defaults ({SamplingParams field: value}) this LLM applies:
        all of them, except under speculative decoding its repetition penalty, which speculative decoding
        does not support (said once on stderr) - a request that asks for a penalty itself is refused."""
        defaults = dict(self.generation.defaults)
        if getattr(self, "speculative_config", None) and defaults.get("repetition_penalty", 1.0) != 1.0:
            dropped = defaults.pop("repetition_penalty")
            if not getattr(self, "_noted_dropped_penalty", False):
                self._noted_dropped_penalty = True
                print(
                    f"nonstop: not applying the checkpoint's repetition_penalty {dropped:g} (generation_config.json): "
                    "speculative decoding does not support penalties",
                    file=sys.stderr,
                )
        return defaults

    def default_sampling(self, **overrides) -> SamplingParams:
        """SamplingParams from ``sampling_defaults()`` (the checkpoint's generation_config.json),
        ``overrides`` (not None) on top."""
        return SamplingParams(**{**self.sampling_defaults(), **{k: v for k, v in overrides.items() if v is not None}})

    def _sampling(self, sampling, also: str = "") -> SamplingParams:
        """``sampling`` (one SamplingParams), or None: ``default_sampling()``; ``also`` names what else the caller
        takes, for the message."""
        if sampling is None:
            return self.default_sampling()
        if not isinstance(sampling, SamplingParams):
            raise TypeError(
                f"sampling must be a SamplingParams{also} or None for the defaults, got {type(sampling).__name__}"
            )
        return sampling

    def check_length(self, prompt_tokens: int, max_tokens: int) -> None:
        """Refuse a prompt of ``prompt_tokens`` that with ``max_tokens`` to generate exceeds the model's context
        (what the engine checks when it admits the request; here before anything runs)."""
        check_fits(prompt_tokens, max_tokens, self.cfg.max_position_embeddings)

    def check_penalties(self, params: SamplingParams) -> None:
        """Refuse ``params`` asking for a repetition, presence or frequency penalty under speculative decoding,
        which does not support them: ``InvalidSamplingParam`` (a ValueError) naming the first one asked for."""
        if not (self.speculative_config and params.penalized):
            return
        asked = [name for name, off in PENALTIES_OFF.items() if getattr(params, name) != off]
        raise InvalidSamplingParam(
            asked[0],
            f"{', '.join(f'{name} {getattr(params, name):g}' for name in asked)}: repetition, presence and "
            "frequency penalties are not supported with speculative decoding (leave them off: repetition_penalty 1, "
            "presence and frequency 0)",
        )

    # ------------------------------------------------------------------ requests
    def make_request(
        self, prompt: str | None, prompt_ids: list[int] | None, params: SamplingParams, request_id: str | None = None
    ) -> Request:
        """One engine request (``params.n`` is not expanded here: see ``make_requests``)."""
        if prompt_ids is None:
            if not isinstance(prompt, str):
                raise TypeError(f"prompts must be strings, got {type(prompt).__name__}")
            prompt_ids = self.tokenizer.encode(prompt)
        else:
            prompt_ids = id_list(prompt_ids, "prompt_ids")
            bad = [t for t in prompt_ids if not 0 <= t < self.cfg.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} is outside the vocabulary (0..{self.cfg.vocab_size - 1})")
        if not prompt_ids:
            raise ValueError("empty prompt: give at least one token")
        bad = [t for t in params.stop_token_ids if t >= self.cfg.vocab_size]
        if bad:  # it could never be generated: the request would run to max_tokens
            raise ValueError(f"stop_token_ids: {bad[0]} is outside the vocabulary (0..{self.cfg.vocab_size - 1})")
        if params.stop_strings and not self.tokenizer.accepts_text:  # no text to match: it would run to max_tokens
            raise InvalidSamplingParam(
                "stop", "stop strings need a tokenizer, and this model decodes token ids only: use stop_token_ids"
            )
        self.check_penalties(params)
        return Request(request_id or str(next(self._ids)), prompt, prompt_ids, params, self.eos_ids)

    def make_requests(
        self, prompt: str | None, prompt_ids: list[int] | None, params: SamplingParams, request_id: str | None = None
    ) -> list[Request]:
        """``params.n`` requests for one prompt; completion i samples with seed ``params.seed_for(i)``."""
        if params.n == 1:
            return [self.make_request(prompt, prompt_ids, params, request_id)]
        first = self.make_request(prompt, prompt_ids, dataclasses.replace(params, n=1), request_id)
        base = first.request_id
        out = []
        for i in range(params.n):
            one = dataclasses.replace(params, n=1, seed=params.seed_for(i))
            out.append(Request(f"{base}-{i}", prompt, first.prompt_ids, one, self.eos_ids))
        return out

    def new_core(self, num_slots: int, isolate_errors: bool = False, max_len: int | None = None) -> EngineCore:
        """An ``EngineCore`` with ``num_slots`` slots and this LLM's prefill chunk and batch invariance."""
        num_slots = check_max_batch(num_slots, "num_slots")  # no slot: nothing is ever admitted
        config = self.speculative_config
        decoder = SpeculativeDecoder(config, self.drafter) if config else None
        return EngineCore(
            self.cfg,
            self.executor,
            self.tokenizer,
            num_slots,
            self.dtype,
            self.device,
            max_len=max_len,
            prefill_chunk=check_prefill_chunk(self.prefill_chunk),
            batch_invariant=self.batch_invariant,
            isolate_errors=isolate_errors,
            speculative_decoder=decoder,
        )

    def generate(
        self, prompts=None, sampling: SamplingParams | list[SamplingParams] | None = None, prompt_token_ids=None
    ) -> list[RequestOutput]:
        """Generate for each prompt (strings) or each token-id list; one RequestOutput per prompt, in order
        (with ``n`` > 1 its ``samples`` hold the n completions). ``prompt_token_ids``: one prompt (a list of ids,
        a 1-D integer numpy array or torch tensor) or several (a list of those, a 2-D array or tensor); an id
        is an int, a numpy integer or a 0-d integer tensor (floats, bools and strings are refused, never
        converted). ``sampling``: one SamplingParams for every prompt, a list or tuple of them (one per
        prompt), or None: ``default_sampling()``."""
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of prompts or prompt_token_ids")
        if prompts is not None:
            items = [(p, None) for p in prompt_list(prompts)]
        else:
            items = [(None, ids) for ids in prompt_id_lists(prompt_token_ids)]
        if isinstance(sampling, (list, tuple)):
            for i, sp in enumerate(sampling):
                if not isinstance(sp, SamplingParams):
                    raise TypeError(
                        f"sampling[{i}] must be a SamplingParams, got {type(sp).__name__} "
                        "(give one SamplingParams, a list of them, one per prompt, or None for the defaults)"
                    )
            params = list(sampling)
        else:
            params = [self._sampling(sampling, " (or a list of them, one per prompt)")] * len(items)
        if len(params) != len(items):
            raise ValueError(f"got {len(params)} SamplingParams for {len(items)} prompts")
        groups = []
        for i, ((p, ids), sp) in enumerate(zip(items, params)):
            try:
                group = self.make_requests(p, ids, sp)
                self.check_length(len(group[0].prompt_ids), sp.max_tokens)
                groups.append(group)
            except (TypeError, ValueError) as exc:
                if len(items) > 1:  # which of the prompts
                    exc.args = (f"prompt {i}: {exc}", *exc.args[1:])
                raise
        self._run([r for g in groups for r in g])
        return [_gathered(g) for g in groups]

    def chat(self, messages: list[dict], sampling: SamplingParams | None = None) -> RequestOutput:
        """The assistant's reply to ``messages`` ([{role, content}]), prompted with the chat template.
        Messages are checked as the server checks them (``chat_template.check_messages``)."""
        ids = chat_prompt(self.tokenizer, check_messages(messages))
        return self.generate(prompt_token_ids=[ids], sampling=sampling)[0]

    def _run(self, requests: list[Request], on_text=None) -> None:
        """Run ``requests`` to the end; ``on_text(request, new text)`` as text arrives (streaming)."""
        if not requests:
            return
        with self._calls:
            self._run_locked(requests, on_text)

    def _run_locked(self, requests: list[Request], on_text) -> None:
        core = self.new_core(min(self.max_batch, len(requests)))
        for req in requests:
            core.check_length(req)
        stats = getattr(self.executor, "stats", None)
        compiles = isinstance(stats, dict) and "compiling_s" in stats  # the cpu backend's torch.compile
        if compiles:
            for req in requests:
                req.extra_metrics["decode_compiling_s"] = 0.0
        pending = list(requests)
        while pending or core.active:
            while pending and core.has_free_slot:
                core.admit(pending.pop(0))
            compiled_before, started = (stats["compiling_s"], time.perf_counter()) if compiles else (0.0, 0.0)
            for req, text in core.step():
                if on_text is not None and text:
                    on_text(req, text)
            if compiles and stats["compiling_s"] > compiled_before:
                _charge_decode_compiling(requests, stats["compiling_s"] - compiled_before, started)

    def stream(
        self,
        prompt: str | None = None,
        sampling: SamplingParams | None = None,
        prompt_ids: list[int] | None = None,
        on_text=None,
    ) -> RequestOutput:
        """Generate one completion of ``prompt`` (text) or ``prompt_ids`` (token ids; exactly one of them),
        calling ``on_text(new text)`` as each piece becomes visible."""
        if (prompt is None) == (prompt_ids is None):
            raise ValueError("give exactly one of prompt or prompt_ids")
        if on_text is not None and not callable(on_text):
            raise TypeError(f"on_text must be a function of the new text (or None), got {type(on_text).__name__}")
        params = self._sampling(sampling)
        if params.n != 1:
            raise ValueError(f"stream gives one completion: n must be 1, got {params.n} (generate gives n of them)")
        req = self.make_request(prompt, prompt_ids, params)
        self._run([req], (lambda _, text: on_text(text)) if on_text is not None else None)
        return req.output()


def _charge_decode_compiling(requests: list[Request], seconds: float, step_started: float) -> None:
    """Add ``seconds`` of compiling, done by the step that began at ``step_started``, to the metric
    ``decode_compiling_s`` of each request whose decode interval (first token .. end) holds that step: a
    step that produced a request's first token compiled before it (its time to first token holds that)."""
    for req in requests:
        if req.first_token_at is not None and req.first_token_at < step_started:
            if req.finished_at is None or req.finished_at >= step_started:
                req.extra_metrics["decode_compiling_s"] += seconds


def _gathered(requests: list[Request]) -> RequestOutput:
    """The output of one prompt: its only request's, or for n > 1 the first's with all n in ``samples``."""
    outputs = [r.output() for r in requests]
    if len(outputs) == 1:
        return outputs[0]
    return dataclasses.replace(outputs[0], samples=outputs)


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
            print(
                f"\r{label}: {pct:3d}% ({done}/{total} tensors)",
                end="\n" if done == total else "",
                file=sys.stderr,
                flush=True,
            )

    return report
