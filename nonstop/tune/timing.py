"""Timing on a GPU that a kernel cannot game, and the op's bandwidth floor.

The plan (``plan_timing``, one per tuned shape): ``WEIGHT_DRAWS`` independent draws of the op's weights
and ``INPUT_DRAWS`` of everything else (buffers, caches, states; outputs poisoned), all of one
structure. The child (``child_run.time_shape``) rebuilds the state once and, before each launch, copies
in one (weights, inputs) pairing - every pairing exactly once, in a random order - so no launch ever
sees inputs a previous launch saw: a result cached by address, by value, or in recycled memory is
stale. It flushes the L2 cache, brackets the launch with CUDA events, and keeps the outputs of a few
random launches (and the last): the parent checks those against the twin on the same pairing, so a
kernel that skips work when it thinks it is being timed is caught. Median / p10 / p90 of the launches
after the warm-up.

floor = (bytes read + bytes written, from the op's cost model) / peak HBM bandwidth. The peak is the
larger of the data-sheet figure for the device name and the one computed from the device properties
(2 × memory clock × bus width), so the floor is never above what the memory can do: a median below it
did not move its bytes and is rejected. On a CPU nothing is timed.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

import torch

from nonstop.hostinfo import nearest_rank
from nonstop.tune.cases import CaseSpec, State, build_state, run_twin, twin_on
from nonstop.tune.judge import judge_call
from nonstop.tune.state import Packed, pack

WEIGHT_DRAWS, INPUT_DRAWS = 4, 16  # 64 pairings: launches of one timing, each pairing once
CHECKED = 8  # random timed launches whose outputs are checked (plus the last)
WARMUP = 4

# data-sheet HBM bandwidth, bytes/s, by a substring of torch.cuda.get_device_name (the longest that matches)
DATASHEET = {
    "H200": 4.8e12,
    "H100 NVL": 3.9e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "GH200": 4.9e12,
    "B200": 8.0e12,
    "B100": 8.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB": 2.039e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "MI300X": 5.3e12,
}


def peak_bandwidth(device) -> tuple[float, str]:
    """(bytes/s, where the figure comes from) for a CUDA device; (inf, "cpu: untimed") otherwise."""
    device = torch.device(device)
    if device.type != "cuda":
        return float("inf"), "cpu: untimed"
    name = torch.cuda.get_device_name(device)
    sheet = datasheet_bandwidth(name)
    props = torch.cuda.get_device_properties(device)
    clock_khz = getattr(props, "memory_clock_rate", 0) or 0
    bus_bits = getattr(props, "memory_bus_width", 0) or 0
    computed = 2.0 * clock_khz * 1e3 * bus_bits / 8
    if max(sheet, computed) <= 0:
        return 20e12, f"{name}: unknown, assumed 20 TB/s (above any GPU made)"
    source = f"{name}: " + ("data sheet" if sheet >= computed else "2 x memory clock x bus width")
    return max(sheet, computed), source


def datasheet_bandwidth(name: str) -> float:
    """The data-sheet HBM bandwidth (bytes/s) of the GPU ``torch.cuda.get_device_name`` calls ``name``; 0.0 when
    none is listed. The longest key found in the name wins: "NVIDIA GH200 480GB" is a GH200, not an H200, and
    "NVIDIA H100 PCIe" is no SXM H100."""
    found = [key for key in DATASHEET if key in name]
    return DATASHEET[max(found, key=len)] if found else 0.0


def floor_seconds(bytes_moved: int, peak: float) -> float:
    return bytes_moved / peak


@dataclass
class TimingPlan:
    key: str
    spec: CaseSpec
    kind: str
    base: Packed  # the structure (and the bytes of pairing (0, 0))
    weights: list[dict[int, torch.Tensor]]  # per weight draw: the bytes of the op's weight storages
    inputs: list[dict[int, torch.Tensor]]  # per input draw: the bytes of every other storage
    sequence: list[tuple[int, int]]  # (weight draw, input draw) of each launch
    checked: list[int]  # launches whose outputs come back
    outputs: list[int]  # storages the op writes

    def job(self) -> dict:
        return {
            "base": self.base,
            "weights": self.weights,
            "inputs": self.inputs,
            "sequence": self.sequence,
            "checked": self.checked,
            "outputs": self.outputs,
            "warmup": WARMUP,
        }

    def pairing(self, launch: int) -> Packed:
        j, k = self.sequence[launch]
        storages = list(self.base.storages)
        for s, raw in {**self.weights[j], **self.inputs[k]}.items():
            storages[s] = raw
        return Packed(self.base.skeleton, self.base.views, storages, self.base.paths)


def _weight_storages(packed: Packed) -> set[int]:
    return {packed.views[i].storage for p, i in packed.paths.items() if p.startswith("op.")}


def plan_timing(key: str, spec: CaseSpec, kind: str, device, rng: random.Random) -> TimingPlan:
    base_state: State = build_state(spec, kind, device, rng.randrange(2**31), rng.randrange(2**31))
    base = pack(base_state.roots())
    weight_ids = _weight_storages(base)

    def part(packed: Packed, weights: bool) -> dict[int, torch.Tensor]:
        if packed.views != base.views or packed.paths != base.paths:
            raise RuntimeError(f"timing draws of {kind} at {key} differ in structure")
        return {s: raw for s, raw in enumerate(packed.storages) if (s in weight_ids) == weights}

    weights = [part(base, True)] + [
        part(pack(build_state(spec, kind, device, rng.randrange(2**31), rng.randrange(2**31)).roots()), True)
        for _ in range(WEIGHT_DRAWS - 1)
    ]
    inputs = [part(base, False)] + [
        part(pack(build_state(spec, kind, device, 0, rng.randrange(2**31), model=base_state.model).roots()), False)
        for _ in range(INPUT_DRAWS - 1)
    ]
    sequence = [(j, k) for j in range(WEIGHT_DRAWS) for k in range(INPUT_DRAWS)]
    rng.shuffle(sequence)
    checked = sorted(rng.sample(range(WARMUP, len(sequence) - 1), CHECKED)) + [len(sequence) - 1]
    run_twin(base_state)
    outputs = [
        s for s, (a, b) in enumerate(zip(base.storages, pack(base_state.roots()).storages)) if not torch.equal(a, b)
    ]
    return TimingPlan(key, spec, kind, base, weights, inputs, sequence, checked, outputs)


def twin_after(plan: TimingPlan, launch: int, device) -> tuple[Packed, list[torch.Tensor]]:
    """(the packed pairing of ``launch``, its storages after the twin ran on it)."""
    packed = plan.pairing(launch)
    return packed, twin_on(packed, device)


def judge_timing(plan: TimingPlan, measured: dict, bytes_moved: int, device, tol) -> tuple[list[str], dict]:
    """(problems, timing entry) of one shape's measurement."""
    label = f"timed launches at {plan.key}"
    if measured is None or measured.get("error"):
        return [f"{label}: {measured.get('error') if measured else 'no measurement came back'}"], {}
    if measured["violations"] or measured["guards_broken"] or measured["modified"]:
        first = (
            measured["violations"]
            or [
                "wrote outside its tensors or into its inputs "
                f"(storages {measured['guards_broken'] + measured['modified']})"
            ]
        )[0]
        return [f"{label}: {first}"], {}
    views = {path: _view_tuple(plan.base.views[i]) for path, i in plan.base.paths.items()}
    for launch, outs in measured["outputs"].items():
        packed, after = twin_after(plan, launch, device)
        rec = {"triton_launches": 1, "outputs": outs, "views": views, "guards_broken": [], "modified": []}
        problems = judge_call(rec, packed, after, plan.outputs, tol, f"{label}, launch {launch}")
        if problems:
            return problems, {}
    ms = sorted(measured["ms"])
    peak, source = peak_bandwidth(device)
    floor = floor_seconds(bytes_moved, peak)
    median = statistics.median(ms)
    entry = {
        "median_ms": median,
        "p10_ms": nearest_rank(ms, 0.1),
        "p90_ms": nearest_rank(ms, 0.9),
        "launches": len(ms),
        "floor_ms": floor * 1e3,
        "bytes_moved": bytes_moved,
        "peak_bandwidth": peak,
        "peak_source": source,
    }
    if median * 1e-3 < floor:
        why = (
            f"{label}: median {median * 1e3:.2f} us is faster than the bandwidth floor {floor * 1e6:.2f} us "
            f"({bytes_moved} bytes at {peak / 1e12:.2f} TB/s): impossible, rejected"
        )
        return [why], {}
    return [], entry


def _view_tuple(v) -> tuple:
    return (v.storage, v.offset, v.shape, v.stride, v.dtype)
