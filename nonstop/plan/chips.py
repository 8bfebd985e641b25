"""The chip catalogue: public specs as data (``chips.json``), each figure with its source.

A ``Chip`` is one accelerator as the planner sees it: HBM capacity and bandwidth, dense tensor peaks
per dtype, and the two network tiers (scale-up domain: NVLink / Infinity Fabric / ICI; scale-out:
InfiniBand / Ethernet / DCN). ``--chip-file`` adds or overrides entries with a JSON file of the same
form. The ``cpu`` entry is filled from this machine's measurements (``measured.py``).
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

CATALOGUE = Path(__file__).with_name("chips.json")
EXECUTORS = ("kernels", "megakernel", "eager")  # how a step is launched (``timing.step_time`` prices each)
DTYPE_ORDER = ("fp4", "fp8", "bf16", "fp32")  # narrow -> wide; an unsupported dtype runs at the next wider one
REQUIRED = (
    "hbm_gb",
    "hbm_gbps",
    "tflops.bf16",
    "scale_up.domain",
    "scale_up.gbps",
    "scale_up.latency_us",
    "scale_out.gbps",
    "scale_out.latency_us",
    "launch_us",
)
COUNTS = ("scale_up.domain", "max_chips")  # figures that count chips
# checked like the required figures where an entry gives them; max_chips: the most chips of this kind a plan
# may use (the cpu entry: 1, no multi-chip CPU layouts are modelled)
OPTIONAL = ("hbm_visible_gb", "max_chips")
# the largest figure an entry may give: far beyond any part, and small enough that no product of figures the
# planner forms (GB x 1e9, TFLOP/s x 1e12, x ranks) overflows to infinity
MAX_FIGURE = 1e15
MAX_DEVICES_PER_CHIP = 64  # ranks one chip holds (TPU7x: 2 TensorCores; a partitioned GPU: up to 8)
# a driver's capacity over the sold one: GiB read as GB is x1.074; a few % may be reserved (B300: 288.4 of 288)
VISIBLE_OVER_SOLD = (0.9, 1.12)


_JSON_KINDS = {
    str: "a string",
    list: "a list",
    int: "a number",
    float: "a number",
    bool: "true / false",
    type(None): "null",
}


class ChipError(ValueError):
    """A bad chip name or chip file (shown to the user as one line)."""


@dataclass(frozen=True)
class Chip:
    key: str
    name: str
    hbm_gb: float  # capacity per chip as sold (the "141GB" of a name), 1e9 B
    hbm_gbps: float  # peak HBM bandwidth per chip, 1e9 B/s
    tflops: dict  # dense peak per dtype ("bf16", "fp8", "fp4", optional "fp32"); None = not native
    devices_per_chip: int  # ranks per chip (TPU7x: 2 TensorCores)
    up_domain: int  # chips in one scale-up domain
    up_gbps: float  # scale-up bandwidth per chip per direction
    up_latency_us: float
    out_gbps: float  # scale-out bandwidth per chip per direction
    out_latency_us: float
    launch_us: float  # per-kernel launch cost inside a captured graph (CPU: eager op dispatch)
    kind: str = "accelerator"
    executor: str = "kernels"  # the executor a plan on this chip defaults to
    sources: dict = field(default_factory=dict, compare=False)
    hbm_visible_gb: float | None = None  # what the driver reports (nvidia-smi / rocm-smi memory.total), 1e9 B
    max_chips: int | None = None  # the most chips of this kind a plan may use (None: no limit of the chip's own)

    @property
    def memory(self) -> str:
        """What the chip's memory is called in a report: a CPU has RAM, an accelerator HBM."""
        return "RAM" if self.kind == "cpu" else "HBM"

    @property
    def hbm_bytes(self) -> float:
        """Capacity per chip the planner fits into: the driver's figure where the catalogue has one. Vendors
        sell HBM in binary units (an H200's "141 GB" reads 143771 MiB = 150.8e9 B in nvidia-smi), so the name's
        figure read as 1e9 B would understate it by up to 7%."""
        return (self.hbm_visible_gb or self.hbm_gb) * 1e9

    # ---- per rank (a rank is one device; TPU7x has two per chip)
    @property
    def rank_hbm_bytes(self) -> float:
        return self.hbm_bytes / self.devices_per_chip

    @property
    def rank_hbm_bps(self) -> float:
        return self.hbm_gbps * 1e9 / self.devices_per_chip

    def rank_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s of one rank for matmuls whose weights are ``dtype`` (falls back to the next
        wider dtype the chip runs natively)."""
        start = DTYPE_ORDER.index(dtype if dtype in DTYPE_ORDER else "bf16")
        for d in DTYPE_ORDER[start:]:
            if self.tflops.get(d):
                return self.tflops[d] * 1e12 / self.devices_per_chip
        raise ChipError(
            f"chip {self.key!r} lists no tensor peak for {dtype} or any wider dtype: plan narrower weights "
            f"(--weights bf16 or fp8), or give the chip a tflops.{dtype} figure in a --chip-file"
        )

    @property
    def up_domain_ranks(self) -> int:
        return self.up_domain * self.devices_per_chip


def _get(entry: dict, path: str):
    value = entry
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _figure(value) -> bool:
    """A usable figure: a positive, finite number no larger than ``MAX_FIGURE``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_FIGURE


def _source(sources: dict, path: str) -> bool:
    """True when ``sources`` says where the figure at ``path`` is published (non-empty text)."""
    return isinstance(sources.get(path), str) and bool(sources[path].strip())


def chip_from_entry(key: str, entry: dict) -> Chip:
    """Validate one catalogue entry: every required figure present, positive and finite (at most
    ``MAX_FIGURE``), each with a source (``sources``: an object keyed by the figure's path); the executor one
    of ``EXECUTORS``."""
    if not isinstance(entry, dict):
        raise ChipError(f"chip {key!r}: an entry must be a JSON object")
    sources = entry.get("sources", {})
    if not isinstance(sources, dict):
        raise ChipError(
            f"chip {key!r}: sources must be an object with a source for each figure, keyed by its path "
            f'(e.g. {{"hbm_gb": "vendor page ..."}}), got {_JSON_KINDS.get(type(sources), "another value")}'
        )
    executor = entry.get("executor", "kernels")
    if executor not in EXECUTORS:
        raise ChipError(f"chip {key!r}: executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    for path in REQUIRED + tuple(p for p in OPTIONAL if _get(entry, p) is not None):
        value = _get(entry, path)
        if not _figure(value):
            raise ChipError(
                f"chip {key!r}: {path} must be a positive finite number (at most {MAX_FIGURE:.0e}), got {value!r}"
            )
        if path in COUNTS and value != int(value):
            raise ChipError(f"chip {key!r}: {path} must be a whole number, got {value!r}")
        if not _source(sources, path):
            raise ChipError(f"chip {key!r}: figure {path} has no source (add sources[{path!r}]: where it is published)")
    dpc = entry.get("devices_per_chip", 1)
    if not isinstance(dpc, int) or isinstance(dpc, bool) or not 1 <= dpc <= MAX_DEVICES_PER_CHIP:
        raise ChipError(
            f"chip {key!r}: devices_per_chip must be a whole number from 1 to {MAX_DEVICES_PER_CHIP}, got {dpc!r}"
        )
    visible, sold = entry.get("hbm_visible_gb"), entry["hbm_gb"]
    if visible is not None and not VISIBLE_OVER_SOLD[0] <= visible / sold <= VISIBLE_OVER_SOLD[1]:
        raise ChipError(
            f"chip {key!r}: hbm_visible_gb {visible:g} is far from hbm_gb {sold:g} (a driver reports the sold size, "
            "read in GiB or GB); is it another part's figure? Give both for this part, or drop hbm_visible_gb"
        )
    for dtype, value in (entry.get("tflops") or {}).items():
        if dtype not in DTYPE_ORDER:
            raise ChipError(
                f"chip {key!r}: tflops.{dtype} is no figure the planner reads (tflops takes {', '.join(DTYPE_ORDER)})"
            )
        if value is None:
            continue
        if not _figure(value):
            raise ChipError(
                f"chip {key!r}: tflops.{dtype} must be a positive finite number or null (at most {MAX_FIGURE:.0e}), "
                f"got {value!r}"
            )
        if not _source(sources, f"tflops.{dtype}"):
            raise ChipError(f"chip {key!r}: figure tflops.{dtype} has no source")
    up, out = entry["scale_up"], entry["scale_out"]
    return Chip(
        key=key,
        name=str(entry.get("name", key)),
        hbm_gb=entry["hbm_gb"],
        hbm_gbps=entry["hbm_gbps"],
        tflops=dict(entry["tflops"]),
        devices_per_chip=int(entry.get("devices_per_chip", 1)),
        up_domain=int(up["domain"]),
        up_gbps=up["gbps"],
        up_latency_us=up["latency_us"],
        out_gbps=out["gbps"],
        out_latency_us=out["latency_us"],
        launch_us=entry["launch_us"],
        kind=str(entry.get("kind", "accelerator")),
        executor=executor,
        sources=dict(sources),
        hbm_visible_gb=visible,
        max_chips=None if entry.get("max_chips") is None else int(entry["max_chips"]),
    )


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ChipError(f"chip file not found: {path}") from None
    except OSError as exc:  # a directory, no permission ...
        raise ChipError(f"chip file {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ChipError(f"chip file {path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ChipError(f"chip file {path}: the top level must be an object of chip entries")
    return {k.lower(): v for k, v in data.items() if not k.startswith("_")}


def load_catalogue(chip_file: str | Path | None = None) -> dict[str, dict]:
    """Raw entries of the bundled catalogue, plus (overriding) those of ``chip_file``. A file entry overrides a
    catalogue entry only under the catalogue's key: one whose name ``--chip`` would read as a catalogue chip
    ("H200 SXM", "h100-80gb") is refused, since the two would be one chip under two names."""
    return _with_file(_read_json(CATALOGUE), chip_file, _file_entries(chip_file))


def _file_entries(chip_file: str | Path | None) -> dict[str, dict]:
    return _read_json(Path(chip_file)) if chip_file is not None else {}


def _with_file(entries: dict, chip_file, extra: dict) -> dict[str, dict]:
    for key in extra:
        same = _catalogue_key(key, entries)
        if same not in (None, key):
            raise ChipError(
                f"chip file {chip_file}: entry {key!r} names the catalogue's {same!r} (as --chip reads it); "
                f"key it {same!r} to override that entry, or give another part a name of its own"
            )
    return {**entries, **extra}


def catalogue_chips(chip_file: str | Path | None = None) -> dict[str, Chip | None]:
    """Every entry of the catalogue (and ``chip_file``) validated, by key; None for the ``cpu`` entry whose
    figures are measured on this machine when it is planned (a ``cpu`` entry of the file is validated)."""
    extra = _file_entries(chip_file)
    entries = _with_file(_read_json(CATALOGUE), chip_file, extra)
    return {
        key: None if key == "cpu" and "cpu" not in extra else _validated(key, e, chip_file if key in extra else None)
        for key, e in sorted(entries.items())
    }


def _validated(key: str, entry: dict, chip_file) -> Chip:
    """``chip_from_entry``, its error naming ``chip_file`` when the entry comes from one (None: the catalogue)."""
    try:
        return chip_from_entry(key, entry)
    except ChipError as exc:
        if chip_file is None:
            raise
        raise ChipError(f"chip file {chip_file}: {exc}") from None


# other names of catalogue chips (compared after ``_squash``): Google's product name for TPU v7
CHIP_ALIASES = {
    "tpu7x": "tpu-v7",
    "tpuv7x": "tpu-v7",
    "ironwood": "tpu-v7",
    "910c": "ascend-910c",
    "atlasa3": "ascend-910c",  # Huawei's Atlas A3 servers and SuperPoDs carry the 910C
    "cloudmatrix384": "ascend-910c",
}
# what vendors and clouds put around a chip's name without changing the chip
_VENDOR_PREFIXES = ("nvidia", "amdinstinct", "amd", "instinct", "google", "huawei")
_FORM_SUFFIXES = ("sxm6ac", "sxm6", "sxm5", "sxm4", "sxm", "nvl72", "oam")  # "NVIDIA B300 SXM6 AC" as drivers name it


def _alnum(name: str) -> str:
    """``name`` lower-cased, letters and digits only."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def _squash(name: str) -> str:
    squashed = _alnum(name)
    squashed = next((squashed[len(p) :] for p in _VENDOR_PREFIXES if squashed.startswith(p)), squashed)
    return next((squashed[: -len(s)] for s in _FORM_SUFFIXES if squashed.endswith(s)), squashed) or name.lower()


def resolve_chip_name(name: str, entries: dict) -> str:
    """The catalogue key ``name`` means: exact, else ignoring case, punctuation and form factor
    ("H200 SXM", "gb300-nvl72", "MI355X"), else an alias ("tpu7x"); unknown names come back lower-cased."""
    key = name.lower()
    if key in entries:
        return key
    by_squash = {_squash(k): k for k in entries}
    by_squash.update({_squash(a): k for a, k in CHIP_ALIASES.items() if k in entries})
    return by_squash.get(_squash(name), key)


_CAPACITY = re.compile(r"^(.*?\w)[\s_-]+(\d+(?:\.\d+)?)\s*gb$", re.IGNORECASE)
_MEMORY_KIND = re.compile(r"[\s_-]+hbm\d?e?$", re.IGNORECASE)  # "NVIDIA H100 80GB HBM3", as the driver names it


def _catalogue_key(name: str, entries: dict) -> str | None:
    """The key of ``entries`` that ``name`` means as ``--chip`` reads it, else None (a trailing size that names
    another part is another part)."""
    key = resolve_chip_name(name, entries)
    if key in entries:
        return key
    try:
        return _strip_capacity(name, entries)
    except ChipError:
        return None


def _strip_capacity(name: str, entries: dict) -> str | None:
    """The catalogue key of a name that ends in its HBM size ("h100-80gb", "B200 180GB"), None if it
    does not; a size more than 10% off the entry's is another part of the same name (H100 NVL: 94 GB)."""
    match = _CAPACITY.match(_MEMORY_KIND.sub("", name.strip()))
    if not match or (key := resolve_chip_name(match[1], entries)) not in entries:
        return None
    have, asked = entries[key].get("hbm_gb"), float(match[2])
    if not isinstance(have, (int, float)):  # the cpu entry: its memory is measured, not named
        return None
    if abs(asked - have) > 0.1 * have:
        raise ChipError(
            f"chip {name!r}: the catalogue's {key} has {have:g} GB of HBM, not {asked:g} GB - another part; "
            "add it with --chip-file"
        )
    return key


def _closest(name: str, entries: dict) -> str:
    """The hint " (did you mean X?)" for the catalogue key or alias nearest ``name`` as ``--chip`` reads it, else ""."""
    names = {_squash(k): k for k in entries} | {_squash(a): a for a, k in CHIP_ALIASES.items() if k in entries}
    near = difflib.get_close_matches(_squash(name), list(names), n=1, cutoff=0.6)
    return f" (did you mean {names[near[0]]}?)" if near else ""


def _check_nvl72(name: str, key: str, entries: dict) -> None:
    """A name ending in NVL72 means a rack of 72 NVLink-connected GPUs: refuse it for a chip whose scale-up
    domain is smaller ("B200 NVL72" is no HGX B200), naming the catalogue's NVL72 part of that GPU."""
    domain = _get(entries[key], "scale_up.domain")
    if not _alnum(name).endswith("nvl72") or not isinstance(domain, (int, float)) or domain >= 72:
        return
    racks = [k for k, e in entries.items() if key in k and _get(e, "scale_up.domain") == 72]
    hint = f"; the {key.upper()} of an NVL72 rack is the catalogue's {' / '.join(racks)}" if racks else ""
    raise ChipError(
        f"chip {name!r}: the catalogue's {key} is a board of {domain:g} NVLink-connected chips, not an NVL72 rack{hint}"
    )


def get_chip(name: str, chip_file: str | Path | None = None) -> Chip:
    """The chip called ``name`` (``resolve_chip_name``, a trailing HBM size allowed); ``cpu`` is measured
    on this machine. An unknown name is answered with the nearest known one."""
    entries = load_catalogue(chip_file)
    key = resolve_chip_name(name, entries)
    if key not in entries:
        key = _strip_capacity(name, entries) or key
    if key not in entries:
        raise ChipError(
            f"unknown chip {name!r}{_closest(name, entries)}; known chips: {', '.join(sorted(entries))} (add one "
            "with --chip-file)"
        )
    _check_nvl72(name, key, entries)
    in_file = chip_file is not None and key in _read_json(Path(chip_file))
    if key == "cpu" and not in_file:
        from nonstop.plan.measured import cpu_entry

        return chip_from_entry(key, cpu_entry(entries[key]))
    return _validated(key, entries[key], chip_file if in_file else None)


def chip_names(chip_file: str | Path | None = None) -> list[str]:
    return sorted(load_catalogue(chip_file))
