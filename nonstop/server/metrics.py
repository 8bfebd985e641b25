"""Prometheus metrics in the text exposition format (version 0.0.4), written without a client library.

Counters and histograms are updated by the server as requests finish; gauges are read from the
engine when ``/metrics`` is scraped, so they are never stale.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# seconds; TTFT spans a queue wait, TPOT one decode step
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
    return "{" + body + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


class Counter:
    def __init__(self, name: str, help: str):
        self.name, self.help = name, help
        self.values: dict[tuple, float] = {}

    def inc(self, amount: float = 1.0, **labels) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        out += [f"{self.name}{_labels(dict(k))} {_number(v)}" for k, v in sorted(self.values.items())]
        if not self.values:
            out.append(f"{self.name} 0")
        return out


class Gauge:
    """A value read from ``read()`` at scrape time."""

    def __init__(self, name: str, help: str, read: Callable[[], float]):
        self.name, self.help, self.read = name, help, read

    def lines(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge", f"{self.name} {_number(self.read())}"]


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        self.name, self.help = name, help
        self.bounds = tuple(sorted(buckets)) + (math.inf,)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.sum += value
        self.count += 1

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, n in zip(self.bounds, self.counts):
            cumulative += n
            out.append(f'{self.name}_bucket{{le="{_number(bound)}"}} {cumulative}')
        out += [f"{self.name}_sum {_number(self.sum)}", f"{self.name}_count {self.count}"]
        return out


class ServerMetrics:
    """The server's metrics. ``active`` / ``waiting`` read the engine's current counts."""

    def __init__(self, active: Callable[[], int], waiting: Callable[[], int]):
        self._lock = threading.Lock()
        self.requests = Counter("nonstop_requests_total", "HTTP requests by endpoint and status code.")
        self.finished = Counter(
            "nonstop_request_finish_total",
            "Generation requests that ended, by finish reason (stop, length, abort, error).",
        )
        self.prompt_tokens = Counter(
            "nonstop_prompt_tokens_total",
            "Prompt tokens of requests that ended (one request per completion: n=2 counts its prompt twice).",
        )
        self.generation_tokens = Counter("nonstop_generation_tokens_total", "Tokens generated.")
        self.ttft = Histogram(
            "nonstop_time_to_first_token_seconds",
            "Time from request arrival to its first generated token.",
            TTFT_BUCKETS,
        )
        self.tpot = Histogram(
            "nonstop_time_per_output_token_seconds",
            "Mean time per generated token after the first, per request.",
            TPOT_BUCKETS,
        )
        self.latency = Histogram(
            "nonstop_request_latency_seconds", "Time from request arrival to its last token.", LATENCY_BUCKETS
        )
        self.gauges = [
            Gauge("nonstop_active_sequences", "Sequences holding a cache slot (prefilling or decoding).", active),
            Gauge("nonstop_queue_depth", "Requests waiting for a free slot.", waiting),
        ]

    def count_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests.inc(endpoint=endpoint, status=str(status))

    def record_finished(self, reason: str, prompt_tokens: int, generated_tokens: int, metrics: dict) -> None:
        """One generation ended: counts, and its TTFT / TPOT / latency when it produced tokens."""
        with self._lock:
            self.finished.inc(reason=reason)
            self.prompt_tokens.inc(prompt_tokens)
            self.generation_tokens.inc(generated_tokens)
            if generated_tokens:
                self.ttft.observe(metrics["time_to_first_token_s"])
                self.latency.observe(metrics["time_to_first_token_s"] + metrics["decode_time_s"])
            if generated_tokens > 1:
                self.tpot.observe(metrics["decode_time_s"] / (generated_tokens - 1))

    def render(self) -> str:
        with self._lock:
            families = [
                self.requests,
                self.finished,
                self.prompt_tokens,
                self.generation_tokens,
                self.ttft,
                self.tpot,
                self.latency,
                *self.gauges,
            ]
            return "\n".join(line for f in families for line in f.lines()) + "\n"
