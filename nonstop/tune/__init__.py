"""The super-operator agent: propose kernel candidates, verify them against the twins, time them, keep the best.

``nonstop tune`` (``commands/tune.py``) runs ``loop.tune``: a proposer (``search.SearchProposer``: the
current kernel's tunables; ``llm.LLMProposer``: any OpenAI-compatible endpoint, prompt from ``prompt.py``)
writes candidate files; ``verify.verify`` checks each - ``static_check`` (an allow-list of what a candidate
file may contain), then a sandboxed child process (``sandbox``, ``child``, ``child_run``) that runs it on
states built here (``cases``, moved with guard bands by ``state``) while the twin runs in this process,
and ``judge`` / ``timing`` decide; ``store`` keeps the winners for ``runtime/tuned.py``, which the superop
executor reads. docs/tune.md describes the candidate format and every check.
"""
