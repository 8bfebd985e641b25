"""``SpeculativeConfig``: what ``LLM(speculative={...})`` and the CLI flags choose."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

from nonstop.program.ir import MAX_STEP_ROWS

METHODS = ("ngram", "dspark")


def _ngram_option_error(name: str, method) -> ValueError:
    return ValueError(f"speculative {name} is an ngram option; method {method!r} does not match n-grams")


@dataclass
class SpeculativeConfig:
    """method: ``ngram`` (prompt lookup) or ``dspark`` (the block drafter shipped with the model).
    num_tokens: drafts proposed per step (the target verifies num_tokens + 1 rows; 0 = none).
    ngram_max / ngram_min: n-gram sizes tried, longest first. drafter: the DSpark drafter directory
    (default: ``dspark/`` inside the model directory)."""

    method: str
    num_tokens: int = 4
    ngram_max: int = 4
    ngram_min: int = 2
    drafter: str | None = None

    def __post_init__(self):
        if not isinstance(self.method, str) or self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(METHODS)}, got {self.method!r}")
        n = self.num_tokens
        if not _is_int(n) or not 0 <= n < MAX_STEP_ROWS:
            raise ValueError(
                f"speculative num_tokens must be an integer in 0..{MAX_STEP_ROWS - 1} "
                f"(verify rows <= {MAX_STEP_ROWS}), got {n!r}"
            )
        for name in ("ngram_max", "ngram_min"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"speculative {name} must be an integer >= 1, got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise ValueError(
                f"speculative n-gram sizes need ngram_min <= ngram_max, got ngram_min={self.ngram_min}, "
                f"ngram_max={self.ngram_max}"
            )
        defaults = {f.name: f.default for f in fields(self)}
        given = [name for name in ("ngram_max", "ngram_min") if getattr(self, name) != defaults[name]]
        if given and self.method != "ngram":
            raise _ngram_option_error(given[0], self.method)
        if self.drafter is not None and self.method != "dspark":
            raise ValueError(f"speculative drafter is a dspark option; method {self.method!r} drafts without one")
        if self.drafter is not None and not isinstance(self.drafter, (str, os.PathLike)):
            raise ValueError(
                f"speculative drafter must be a directory (a str or path) or None, got {type(self.drafter).__name__} "
                f"{self.drafter!r}"
            )
        if self.drafter is not None and not os.fspath(self.drafter).strip():
            raise ValueError("speculative drafter is an empty path; leave it out to use the model's dspark/ directory")

    @classmethod
    def parse(cls, value) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, or a dict such as {"method": "ngram", "num_tokens": 4}."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, dict):
            raise TypeError(
                f"speculative must be a dict like {{'method': 'ngram', 'num_tokens': 4}}, got {type(value).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(k if isinstance(k, str) else repr(k) for k in set(value) - known)  # keys of any type
        if unknown:
            raise ValueError(f"unknown speculative option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if "method" not in value:
            raise ValueError("speculative needs a 'method' (ngram or dspark)")
        ngram = sorted(name for name in ("ngram_max", "ngram_min") if name in value)
        if ngram and value["method"] == "dspark":  # asked for, even at its default: it would do nothing
            raise _ngram_option_error(ngram[0], value["method"])
        return cls(**value)


def _is_int(value) -> bool:
    """A Python int that is not a bool (options come from Python or JSON, never numpy)."""
    return isinstance(value, int) and not isinstance(value, bool)


def drafter_dir(config: SpeculativeConfig, model_dir: Path | None) -> Path:
    """The DSpark drafter directory of ``config``: its ``drafter``, else ``dspark/`` inside the model
    directory (the only place the command line looks: it has no flag for another), its config.json read
    and ``config.num_tokens`` checked against its block size. Known before the target's weights load, so
    a missing drafter or one that cannot draft that many is refused first."""
    path = _find_drafter(config, model_dir)
    from nonstop.engine.speculative.dspark import DSparkConfig

    DSparkConfig.load(path / "config.json").check_num_tokens(config.num_tokens)
    return path


def _find_drafter(config: SpeculativeConfig, model_dir: Path | None) -> Path:
    if config.drafter is not None:
        path = Path(config.drafter)
        if not (path / "config.json").exists():
            raise ValueError(f"dspark drafting needs a trained drafter: no config.json in the drafter directory {path}")
        return path
    if model_dir is None:
        raise ValueError(
            "dspark drafting needs a trained drafter, and a preset (random weights) has no model directory to hold "
            "one: use --speculative ngram, or from Python speculative={'method': 'dspark', 'drafter': DIR}"
        )
    path = Path(model_dir) / "dspark"
    if not (path / "config.json").exists():
        raise ValueError(
            f"dspark drafting needs a trained drafter: none at {path} (no config.json). The command line looks only "
            "there: put the drafter's files in that directory or use --speculative ngram; from Python give "
            "speculative={'method': 'dspark', 'drafter': DIR}"
        )
    return path


def make_drafter(config: SpeculativeConfig, model, model_dir: Path | None):
    """The drafter object for ``config`` and the loaded target ``model`` (a ``CausalLM``)."""
    if config.method == "ngram":
        from nonstop.engine.speculative.ngram import NgramDrafter

        return NgramDrafter(config.ngram_max, config.ngram_min)
    from nonstop.engine.speculative.dspark_drafter import DSparkDrafter

    return DSparkDrafter.load(drafter_dir(config, model_dir), model, config.num_tokens)
