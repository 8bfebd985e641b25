"""Programmatic dependent launch (PDL) for the launcher kernels (see ``nonstop/runtime/cuda_graph.py``).

Every launcher kernel takes a ``USE_PDL: tl.constexpr`` and starts with

    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # the previous kernel has finished and its writes are visible

so it may be launched before its predecessor ends (launch latency and prologue overlap the
predecessor's tail) and still reads only finished outputs. A false constexpr branch is never compiled
(nor run by the interpreter). ``launch(op, env)`` passes ``**pdl_launch_args(env)``.
"""

from __future__ import annotations


def pdl_launch_args(env) -> dict:
    """Launch keywords of a kernel that opts in: ``USE_PDL`` (the launcher's constexpr) plus the
    executor's ``env.launch_kwargs`` (``launch_pdl=True``) when ``env.pdl``. An env without ``pdl``
    (the twins' ``StepEnv``: kernel tests) gives ``{"USE_PDL": False}``."""
    if not getattr(env, "pdl", False):
        return {"USE_PDL": False}
    return {"USE_PDL": True, **env.launch_kwargs}
