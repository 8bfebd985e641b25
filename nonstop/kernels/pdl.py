"""Programmatic dependent launch (PDL) for the launcher kernels (see ``nonstop/runtime/cuda_graph.py``).

Every launcher kernel takes a ``USE_PDL: tl.constexpr`` and starts with ``pdl_wait(USE_PDL)``: with
PDL the previous kernel has finished and its writes are visible past that point, so the launcher may
be launched before its predecessor ends (launch latency and prologue overlap the predecessor's tail)
and still reads only finished outputs. A false constexpr branch is never compiled (nor run by the
interpreter). ``launch(op, env)`` passes ``**pdl_launch_args(env)``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pdl_wait(USE_PDL: tl.constexpr):
    """With ``USE_PDL``: wait until the preceding grid has completed and its memory is visible."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()


def pdl_launch_args(env) -> dict:
    """Launch keywords of a kernel that opts in: ``USE_PDL`` (the launcher's constexpr) plus the
    executor's ``env.launch_kwargs`` (``launch_pdl=True``) when ``env.pdl``. An env without ``pdl``
    (the twins' ``StepEnv``: kernel tests) gives ``{"USE_PDL": False}``."""
    if not getattr(env, "pdl", False):
        return {"USE_PDL": False}
    return {"USE_PDL": True, **env.launch_kwargs}
