"""``nonstop plan``: predict memory fit and ms/token of a model on a cluster of chips (``nonstop/plan``)."""

from __future__ import annotations

import json
import sys

from nonstop.commands.common import non_negative_int, positive_int

DESCRIPTION = (
    "Predict whether a model fits a cluster and how fast it decodes, before renting it. The model side comes "
    "from nonstop's own decode Program (every super-op's bytes and FLOPs, shapes only) and, for a parallel "
    "layout, from nonstop.dist's per-rank Program and collective sizes; the chip side from a catalogue of "
    "public specs with sources (--list-chips; add one with --chip-file). A few efficiency constants, shared "
    "by every prediction, are fitted on published Kimi K3 decode results (docs/plan.md). Without any layout flag "
    "(--tp, --dp, --ep, --pp, --dcp or their vLLM / SGLang spellings) every layout is tried and the best that fit "
    "are shown; with one, that one layout is planned (--tp / --dp left out: tp = a stage's ranks, dp 1). Layout "
    "sizes count ranks (devices): a TPU7x chip is two ranks."
)
DEFAULT_MODEL = "kimi-k3"
DEFAULT_BATCH = 1
DEFAULT_TOP = 5
DEFAULT_SHARDING = "production"
MAX_DRAFTS = 64  # the most --spec-draft: far beyond what drafters run a step (K3's DSpark drafters: 7)
FEWEST_CHIPS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # tried in turn without --chips


def add_parser(sub) -> None:
    from nonstop.plan.workload import FORMAT_BYTES

    p = sub.add_parser("plan", help="predict memory fit and ms/token on a cluster", description=DESCRIPTION)
    p.add_argument(
        "--model",
        "-m",
        help="preset, bundled model, planner model (deepseek-v3, kimi-k2-thinking: shapes only), a released name "
        "with or without its publisher (moonshotai/Kimi-K2.5, nvidia/Kimi-K3-NVFP4, deepseek-ai/DeepSeek-R1-0528: "
        f"its stored formats are the defaults) or checkpoint directory (default {DEFAULT_MODEL})",
    )
    p.add_argument(
        "--chip",
        help="chip from the catalogue (see --list-chips) by its key or as vendors and drivers write it (case, "
        "punctuation, vendor prefix and SXM / NVL72 / OAM ignored: 'NVIDIA H100 80GB HBM3', 'gb300-nvl72', NVL72 "
        "only where the chip's NVLink domain is 72; aliases "
        "tpu7x / ironwood for tpu-v7, 910c / atlas-a3 for ascend-910c), optionally ending in its memory size "
        "('h100-80gb', 'B200 180GB'; one more than 10%% off the catalogue's is another part, refused); or 'cpu' for "
        "this machine",
    )
    p.add_argument(
        "--chips",
        type=positive_int,
        help=f"number of chips (default: the fewest of {', '.join(map(str, FEWEST_CHIPS))} that fit; the cpu chip: 1, "
        "the only count it plans)",
    )
    p.add_argument(
        "--tp",
        "--tensor-parallel-size",
        "--tp-size",
        type=positive_int,
        help="ranks per attention group (tensor parallel)",
    )
    p.add_argument(
        "--dp",
        "--data-parallel-size",
        "--dp-size",
        type=positive_int,
        help="attention groups (data parallel); tp x dp x pp = ranks",
    )
    p.add_argument(
        "--pp",
        "--pipeline-parallel-size",
        "--pp-size",
        type=positive_int,
        help="pipeline stages, each tp x dp ranks holding 1/pp of the layers (default 1; the search tries 1, 2, 4, 8; "
        "alone it plans tp = a stage's ranks)",
    )
    p.add_argument(
        "--dcp",
        "--decode-context-parallel-size",
        "--dcp-size",
        type=positive_int,
        help="decode context parallel: each attention group's cached tokens split over DCP of its TP ranks "
        "(divides --tp; MLA/GQA cache reads and capacity / DCP, plus per attention layer an all-gather of "
        "queries and a reduce-scatter of partial outputs; default 1, not searched: alone it plans tp = all ranks)",
    )
    p.add_argument(
        "--ep",
        "--expert-parallel-size",
        "--ep-size",
        type=positive_int,
        help="expert parallel: experts spread over EP ranks; 1 (default with a layout) = experts "
        "tensor-parallel in each attention group",
    )
    p.add_argument(
        "--enable-expert-parallel",
        action="store_true",
        help="vLLM's spelling: experts spread over every rank of a stage (EP = tp x dp)",
    )
    p.add_argument(
        "--enable-dp-attention",
        action="store_true",
        help="SGLang's spelling: --tp counts every rank of a stage and attention runs data-parallel over --dp "
        "groups of tp / dp ranks (SGLang --tp 8 --dp 8 --enable-dp-attention = 8 ranks, attention TP1 DP8)",
    )
    p.add_argument(
        "--batch",
        "--concurrency",
        type=positive_int,
        help=f"concurrent sequences in the whole deployment (a serving benchmark's --max-concurrency; default "
        f"{DEFAULT_BATCH})",
    )
    p.add_argument(
        "--context",
        type=non_negative_int,
        help="mean cached tokens per sequence while decoding (default 4096 or the model's limit if shorter, "
        "or from --input-len / --output-len)",
    )
    p.add_argument(
        "--input-len",
        type=positive_int,
        help="prompt tokens per request, as a serving benchmark states them: with --output-len the mean context "
        "while decoding is input + output / 2 (instead of --context), memory must hold the cache of input + output "
        "tokens (the requests' last step), and the plan adds the prefill of one prompt, "
        "the mean time to first token of --concurrency requests started together and what their prefills add per "
        "token in an aggregated server",
    )
    p.add_argument("--output-len", type=positive_int, help="generated tokens per request (with --input-len)")

    p.add_argument(
        "--spec-accept",
        type=float,
        help="speculative decoding: mean accepted length per step incl. the bonus token, in [1, K+1] for K "
        "--spec-draft tokens; no default: without it the plan decodes without speculation",
    )
    p.add_argument(
        "--spec-draft",
        type=positive_int,
        help=f"speculative decoding: tokens K drafted per step, 1 to {MAX_DRAFTS} (default 7 with --spec-accept); "
        "K+1 rows are verified",
    )
    p.add_argument(
        "--executor",
        choices=["kernels", "megakernel", "eager"],
        help="kernels: one launch per super-op in a captured graph (vLLM / SGLang / nonstop superop); "
        "megakernel: one persistent kernel per step; eager: one launch per aten op. Default: the chip's - kernels "
        "on GPUs, megakernel on TPU7x (XLA runs a step as one program), eager on the cpu chip",
    )
    formats = ", ".join(FORMAT_BYTES)
    fp32 = "fp32 needs the chip's tflops.fp32 figure (--list-chips shows it: the NVIDIA GPUs and cpu have one)"
    p.add_argument(
        "--weights",
        help=f"dense weight format: {formats} (default: the checkpoint's; fp32 on the cpu chip; the embedding and "
        f"LM head stay bf16 beside a quantised format); {fp32}",
    )
    p.add_argument(
        "--experts",
        help=f"routed expert format: {formats}; int4 = W4A16, groups of 32 (default: the checkpoint's); {fp32}",
    )
    p.add_argument(
        "--attention-weights",
        dest="attention",
        help=f"attention block format when the checkpoint keeps it apart from --weights (e.g. bf16 in NVFP4 "
        f"exports): {formats}",
    )
    p.add_argument(
        "--kv-cache",
        dest="cache",
        help=f"attention cache format: {formats} (default bf16); a 4-bit cache counts its block scales in its bytes "
        "a token",
    )
    p.add_argument(
        "--sharding",
        choices=["production", "engine"],
        help="production (default): as vLLM/SGLang serve - K3's latent projections split tp ways, and --ep equal "
        "to --tp with --dp 1 runs no all-to-all (the MoE output all-reduce combines); engine: exactly nonstop.dist's "
        "parts and token exchange",
    )
    p.add_argument(
        "--chip-file",
        help="JSON file of extra or overriding chip entries (same form as nonstop/plan/chips.json): every figure "
        "positive and finite, each with its entry in 'sources' (key = the figure's path, e.g. 'tflops.bf16'); an "
        "entry overrides a catalogue chip under the catalogue's key only (another spelling of it is refused)",
    )
    p.add_argument("--top", type=positive_int, help=f"layouts shown by the search (default {DEFAULT_TOP})")
    p.add_argument(
        "--measured",
        action="store_true",
        help="predict every nonstop measurement in bench/results on this chip, side by side, each as it ran (its "
        "model, batch, context, executor; layout, speculation and request flags are refused)",
    )
    p.add_argument(
        "--list-chips",
        action="store_true",
        help="list the catalogue with its figures and exit (with --chip-file: its entries too; with --json: one "
        "object, each chip by its key)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print JSON: one object (ms_per_token, tokens_per_s_per_user, tokens_per_s_total, fits, "
        "bytes_per_chip, bound, breakdown_ms ...); with --measured a list, one object per measurement",
    )
    p.set_defaults(run=run)


def _chips_json(chips: dict) -> dict:
    """The catalogue as one JSON object: each chip's figures and sources by its key; the cpu entry says its
    figures are measured on this machine when it is planned."""
    import dataclasses

    cpu = {"kind": "cpu", "figures": "measured on this machine when it is planned"}
    return {key: dataclasses.asdict(c) if c else cpu for key, c in chips.items()}


def _list_chips(chip_file, as_json: bool) -> int:
    """Print the catalogue (and ``chip_file``'s entries), every entry validated before anything is printed."""
    from nonstop.plan.chips import catalogue_chips

    chips = catalogue_chips(chip_file)
    if as_json:
        print(json.dumps(_chips_json(chips), indent=2))
        return 0
    w = max(8, *(len(key) for key in chips))  # a key as long as "ascend-910c" keeps the columns straight
    n = max(44, *(len(c.name) for c in chips.values() if c))
    print(
        f"{'chip':<{w}} {'name':<{n}} {'HBM GB':>7} {'TB/s':>5} {'bf16':>6} {'fp8':>6} {'fp4':>6} {'fp32':>6}"
        f" {'up':>5} {'GB/s':>5} {'out GB/s':>8}"
    )
    for key, c in chips.items():
        if c is None:
            print(f"{'cpu':<{w}} this machine: figures measured (bench/results copy bandwidth, a matmul, an eager op)")
            continue
        tf = [f"{c.tflops.get(d) or '-':>6}" for d in ("bf16", "fp8", "fp4", "fp32")]
        print(
            f"{key:<{w}} {c.name:<{n}} {c.hbm_bytes / 1e9:>7.1f} {c.hbm_gbps / 1000:>5.2f} {' '.join(tf)}"
            f" {c.up_domain:>5} {c.up_gbps:>5g} {c.out_gbps:>8g}"
        )
    print(
        "(HBM GB = 1e9 B the driver reports, which can exceed the figure a part is sold as; dense TFLOP/s, fp32"
        " the plain FP32 rate, not TF32;"
        " up = scale-up domain in chips; GB/s per chip per direction; sources: nonstop/plan/chips.json)"
    )
    return 0


# the format flags: (flag, args attribute, what it sets)
FORMAT_FLAGS = (
    ("--weights", "weights", "dense weight"),
    ("--experts", "experts", "routed expert"),
    ("--attention-weights", "attention", "attention weight"),
    ("--kv-cache", "cache", "attention cache"),
)


def _check_formats(args) -> None:
    """Each format flag's value is a known format; a bad one is named with its flag."""
    from nonstop.plan.workload import FORMAT_BYTES, PlanError, serving_format

    for flag, attr, what in FORMAT_FLAGS:
        value = getattr(args, attr)
        if value is None:
            continue
        try:
            serving_format(value)
        except PlanError:
            raise ValueError(
                f"{flag} {value!r}: unknown {what} format; choose one of: {', '.join(FORMAT_BYTES)}"
            ) from None


def _precision(args, cfg, chip):
    from nonstop.plan.releases import release_formats
    from nonstop.plan.workload import Precision, quantised_experts

    if args.experts and cfg.moe is None:
        raise ValueError(f"{args.model} has no routed experts: --experts does not apply (use --weights)")
    stored = release_formats(args.model)  # e.g. nvidia/Kimi-K3-NVFP4: experts nvfp4
    cpu = chip.kind == "cpu"
    dense = args.weights or stored.get("dense") or ("fp32" if cpu else None)
    experts = args.experts or stored.get("experts") or ("fp32" if cpu and not quantised_experts(cfg) else None)
    attention = args.attention or stored.get("attention")
    return Precision.released(cfg, dense, experts, args.cache or stored.get("cache"), attention)


# released models the planner knows of and refuses, by the start of their name (without the publisher)
NOT_MODELLED = {
    "deepseek-v3.2": "DeepSeek-V3.2's sparse attention (its lightning indexer picks the cached tokens each query "
    "reads) is not modelled, and V3's dense attention would misprice it (docs/plan.md)",
}


def _resolve(model: str):
    """(config, checkpoint dir) of ``model``: a checkpoint directory, preset, bundled model, or a released
    name the planner knows (``nonstop/plan/releases.py``); an unknown name lists all of them."""
    from pathlib import Path

    from nonstop.config import ConfigError
    from nonstop.plan.releases import model_ref, other_publishers, planner_names
    from nonstop.weights.resolve import resolve_model

    try:
        return resolve_model(model_ref(model))
    except ConfigError as exc:
        if Path(model).exists():
            raise
        name = model.strip().lower().rsplit("/", 1)[-1]
        for prefix, why in NOT_MODELLED.items():
            if name.startswith(prefix):
                raise ConfigError(f"{model} is not planned: {why}") from None
        others = other_publishers(model)
        if others:
            raise ConfigError(
                f"{model} is not a release the planner knows: {' / '.join(others)} is (or give the name alone)"
            ) from None
        raise ConfigError(f"{exc}; planner models and releases (shapes only): {', '.join(planner_names())}") from None


def _spec(args):
    from nonstop.plan.predict import Spec

    if args.spec_accept is None:
        if args.spec_draft is not None:
            raise ValueError("--spec-draft needs --spec-accept (the mean accepted length per step)")
        return None
    if args.spec_draft is not None and args.spec_draft > MAX_DRAFTS:
        raise ValueError(f"--spec-draft {args.spec_draft}: the planner models up to {MAX_DRAFTS} drafted tokens a step")
    return Spec(args.spec_accept, args.spec_draft or 7)


# the largest deployment the planner models: each rank Program lists the expert slots of every rank
MAX_RANKS = 1 << 20


def _requests(args):
    """The requests' lengths (``predict.Requests``) when --input-len / --output-len are given, else None."""
    from nonstop.plan.predict import Requests

    lengths = args.input_len is not None or args.output_len is not None
    if lengths and args.context is not None:
        raise ValueError("give --context or --input-len/--output-len, not both")
    if not lengths:
        return None
    if args.input_len is None or args.output_len is None:
        raise ValueError("--input-len and --output-len go together (context = input + output / 2)")
    return Requests(args.input_len, args.output_len)


def _layout(args, chips: int, devices: int):
    from nonstop.plan.layout import Layout

    pp = args.pp or 1
    where = f"the {chips * devices} ranks ({chips} chip(s) x {devices} device(s))"
    if (chips * devices) % pp:
        raise ValueError(f"--pp {pp} does not divide {where}")
    ranks = chips * devices // pp
    tp, dp = args.tp, args.dp
    if pp > 1:
        where += f", {ranks} a pipeline stage"
    for flag, value in (("--tp", tp), ("--dp", dp), ("--ep", args.ep)):
        if value is not None and ranks % value:
            raise ValueError(f"{flag} {value} does not divide {where}")
    if args.enable_dp_attention:  # SGLang: --tp is the stage's ranks, split into --dp attention groups
        if dp is None or (tp is not None and tp % dp):
            raise ValueError("--enable-dp-attention needs --dp dividing --tp (SGLang: tp ranks, dp attention groups)")
        if tp is not None and tp != ranks:
            raise ValueError(
                f"--enable-dp-attention: SGLang's --tp counts every rank of a stage, so --tp {ranks} here "
                f"(--tp {tp} is not {where})"
            )
        tp = (tp or ranks) // dp
    if tp is None and dp is None:
        tp, dp = ranks, 1
    elif tp is None:
        tp = ranks // dp
    elif dp is None:
        dp = ranks // tp
    if tp * dp != ranks:
        raise ValueError(f"--tp {tp} x --dp {dp} = {tp * dp} ranks, not {where}")
    ep = args.ep or 1
    if args.enable_expert_parallel:  # vLLM: the experts spread over all tp x dp ranks of the stage
        if args.ep not in (None, ranks):
            raise ValueError(f"--enable-expert-parallel spreads the experts over all {ranks} ranks; --ep {args.ep}")
        ep = ranks
    return Layout(tp, dp, ep, args.sharding, pp, args.dcp or 1)


def _fewest_chips(workload, chip, request: dict, sharding: str, progress):
    """(chips, candidates, counts tried) for the fewest of ``FEWEST_CHIPS`` (up to the chip's ``max_chips``) on
    which a layout fits; when none does, the largest count's candidates."""
    from nonstop.plan.search import search

    tried = []
    for n in FEWEST_CHIPS:
        if (chip.max_chips is not None and n > chip.max_chips) or (tried and n * chip.devices_per_chip > MAX_RANKS):
            break
        tried.append(n)
        cands = search(workload, chip, n, **request, sharding=sharding, progress=progress)
        if cands and cands[0].fits:
            break
    return tried[-1], cands, tried


# flags --measured does not use (each run is predicted as it ran): (flag, args attribute), None or False
# when not given (flags with a default get it after the check: ``_fill_defaults``)
MEASURED_IGNORES = (
    ("-m", "model"),
    ("--chips", "chips"),
    ("--tp", "tp"),
    ("--dp", "dp"),
    ("--ep", "ep"),
    ("--pp", "pp"),
    ("--dcp", "dcp"),
    ("--enable-expert-parallel", "enable_expert_parallel"),
    ("--enable-dp-attention", "enable_dp_attention"),
    ("--sharding", "sharding"),
    ("--batch", "batch"),
    ("--context", "context"),
    ("--input-len", "input_len"),
    ("--output-len", "output_len"),
    ("--spec-accept", "spec_accept"),
    ("--spec-draft", "spec_draft"),
    ("--executor", "executor"),
    ("--attention-weights", "attention"),
    ("--top", "top"),
)
# flags --list-chips does not use (it reads only --chip-file and --json)
LIST_CHIPS_IGNORES = (
    ("--chip", "chip"),
    *MEASURED_IGNORES,
    *((flag, attr) for flag, attr, _ in FORMAT_FLAGS if attr != "attention"),
    ("--measured", "measured"),
)


def _refuse_ignored(args, flags, mode: str, what: str) -> None:
    """``mode`` (``--measured``, ``--list-chips``) does ``what`` and uses none of ``flags`` ((flag, args attribute)
    pairs): refuse, in one line, those given on the command line."""
    given = [flag for flag, attr in flags if (value := getattr(args, attr)) is not None and value is not False]
    if given:
        raise ValueError(f"{mode} {what} and ignores {', '.join(given)}: drop them, or plan without {mode}")


def _fill_defaults(args) -> None:
    """The defaults of the flags whose absence the refusals above must see (None until then)."""
    args.model = DEFAULT_MODEL if args.model is None else args.model
    args.batch = DEFAULT_BATCH if args.batch is None else args.batch
    args.top = DEFAULT_TOP if args.top is None else args.top
    args.sharding = args.sharding or DEFAULT_SHARDING


def _counts(counts: list[int]) -> str:
    """Chip counts as a header names them: "1", "1 or 2", "1, 2, 4, ... 512"."""
    if len(counts) <= 2:
        return " or ".join(map(str, counts))
    return ", ".join(map(str, counts[:3])) + (f", ... {counts[-1]}" if len(counts) > 3 else "")


def _measured_json(rows: list[dict]) -> list[dict]:
    from nonstop.plan.report import recorded_on

    return [
        {
            "run": r["measurement"].what,
            "source": r["measurement"].source,
            "measured_ms_per_token": r["measurement"].ms_per_token,
            "predicted_ms_per_token": r["predicted_ms_per_token"],
            "recorded_on": recorded_on(r["measurement"]),
        }
        for r in rows
    ]


def run(args) -> int:
    from nonstop.plan.chips import get_chip
    from nonstop.plan.measured import all_measurements, measurements
    from nonstop.plan.predict import check_positions, default_context, predict
    from nonstop.plan.report import (
        describe,
        layout_table,
        measured_side_by_side,
        measured_table,
        workload_for_measurement,
    )
    from nonstop.plan.search import search
    from nonstop.plan.workload import build_workload

    if args.list_chips:
        _refuse_ignored(
            args,
            LIST_CHIPS_IGNORES,
            "--list-chips",
            "prints the chip catalogue (with --chip-file's entries; --json for one object)",
        )
        return _list_chips(args.chip_file, args.json)
    if not args.chip:
        raise ValueError("give --chip NAME (nonstop plan --list-chips lists them; 'cpu' is this machine)")
    chip = get_chip(args.chip, args.chip_file)
    _check_formats(args)
    overrides = {k: v for k, v in (("dense", args.weights), ("experts", args.experts), ("cache", args.cache)) if v}
    if args.measured:
        _refuse_ignored(
            args,
            MEASURED_IGNORES,
            "--measured",
            "predicts each run in bench/results as it ran (its model, batch, context, executor, one device)",
        )
    _fill_defaults(args)
    if args.measured:
        rows = measured_side_by_side(all_measurements(chip.key), chip, args.model, workload_for_measurement(overrides))
        if args.json:
            print(json.dumps(_measured_json(rows), indent=2))
        else:
            print(measured_table(rows) if rows else f"no nonstop measurement on {chip.key} in bench/results")
        return 0

    cfg, model_dir = _resolve(args.model)
    workload = build_workload(cfg, args.model, _precision(args, cfg, chip))
    moe = bool(workload.moe_ops)
    spec = _spec(args)
    executor = args.executor or chip.executor
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))

    layout_given = any(v is not None for v in (args.tp, args.dp, args.ep, args.pp, args.dcp))
    layout_given = layout_given or args.enable_expert_parallel or args.enable_dp_attention
    chips = args.chips or (1 if chip.kind == "cpu" else None)
    if chips and chip.max_chips is not None and chips > chip.max_chips:
        why = chip.sources.get("max_chips", "the catalogue's max_chips")
        raise ValueError(f"--chips {chips}: {chip.key} plans at most {chip.max_chips} chip(s) - {why}")
    if chips and chips * chip.devices_per_chip > MAX_RANKS:
        raise ValueError(
            f"--chips {chips} is {chips * chip.devices_per_chip:,} ranks; the planner models up to {MAX_RANKS:,} "
            "(a rank Program lists every rank's share of the experts)"
        )
    requests = _requests(args)
    context = requests.context if requests else (default_context(cfg) if args.context is None else args.context)
    check_positions(workload, requests.peak if requests else context)  # before a search
    request = {
        "batch": args.batch,
        "context": context,
        "spec": spec,
        "executor": executor,
        "model_dir": model_dir,
        "requests": requests,
    }
    cands, tried = None, None
    if layout_given:
        if chips is None:
            raise ValueError("give --chips with a layout (--tp/--dp/--ep/--pp/--dcp)")
        best = predict(workload, chip, _layout(args, chips, chip.devices_per_chip), **request)
    else:
        if chips is None:
            chips, cands, tried = _fewest_chips(workload, chip, request, args.sharding, progress)
        else:
            cands = search(workload, chip, chips, **request, sharding=args.sharding, progress=progress)
        if not cands:
            raise ValueError(f"no layout of {chips} {chip.key} chip(s) splits {args.model}'s attention heads")
        first = cands[0]
        best = first.prediction or predict(workload, chip, first.layout, **request)

    ours = measurements(cfg, args.model, chip.key)
    side = measured_side_by_side(ours, chip, args.model, workload_for_measurement(overrides)) if ours else []
    if args.json:
        out = best.to_json()
        if not best.fits:
            out["why_not"] = best.why_not()
        if tried is not None:
            out["chips_tried"] = tried  # without --chips: the counts searched, fewest first
        if cands is not None:
            out["layouts"] = [
                {
                    "tp": c.layout.tp,
                    "dp": c.layout.dp,
                    "ep": c.layout.ep,
                    "pp": c.layout.pp,
                    "dcp": c.layout.dcp,
                    "fits": c.fits,
                    "bytes_per_chip": c.bytes_per_rank * chip.devices_per_chip,
                    "bytes_is_lower_bound": c.prediction is None,  # dropped on the search's quick bound
                    "ms_per_token": c.prediction.ms_per_token if c.prediction else None,
                }
                for c in cands
            ]
        out["measured"] = _measured_json(side)
        print(json.dumps(out, indent=2))
        return 0
    if cands is not None:
        fitting = [c for c in cands if c.fits]
        if tried and not fitting:
            print(f"{args.model} fits no layout of {_counts(tried)} x {chip.key} (each tried); the largest:")
        elif tried and len(tried) > 1:
            print(f"{args.model} fits no layout of {_counts(tried[:-1])} x {chip.key}; the fewest that fit:")
        print(
            f"{args.model} on {chips} x {chip.key}: {len(fitting)} of {len(cands)} layouts fit"
            + ("" if fitting else " - none fits")
        )
        print(layout_table(cands, args.top, chip, moe))
        print()
        if not fitting:
            print(f"does not fit: even the smallest layout ({first.layout.describe(moe)}) {best.why_not()}")
            print()
            print("what it would do if it fit (the smallest layout):")
        else:
            print("best layout:")
    print(describe(best))
    print()
    if side:
        print(f"nonstop's own measurements of {args.model} on {chip.key} (bench/results), predicted for the same runs:")
        print(measured_table(side))
    else:
        others = len(all_measurements(chip.key))
        hint = (
            f"--measured lists the {others} run(s) on {chip.key}: other models, or slices of this one"
            if others
            else f"none on {chip.key} at all; try --chip cpu -m k3-nano"
        )
        print(f"no nonstop measurement of {args.model} on {chip.key} in bench/results ({hint})")
    return 0
