"""A made-up chip for hand-checked planner timings: 100 GB of HBM at 4000 GB/s, 1000 bf16 TFLOP/s, 8 chips a
scale-up domain of 900 GB/s and 2 us, scale-out of 50 GB/s and 10 us, 3 us a launch."""

from __future__ import annotations

from nonstop.plan.chips import Chip


def made_up_chip(**changes) -> Chip:
    """The made-up chip with ``changes`` to its figures (e.g. ``devices_per_chip=2``)."""
    figures = dict(
        key="t",
        name="t",
        hbm_gb=100,
        hbm_gbps=4000,
        tflops={"bf16": 1000},
        devices_per_chip=1,
        up_domain=8,
        up_gbps=900,
        up_latency_us=2.0,
        out_gbps=50,
        out_latency_us=10.0,
        launch_us=3.0,
    )
    return Chip(**{**figures, **changes})
