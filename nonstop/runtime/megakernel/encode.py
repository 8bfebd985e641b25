"""The integer tensors a persistent megakernel reads: task descriptors, waits, weight slices, counters.

  tasks    int32 [N, 9]  opcode, op, stage, tile, counter, wait_begin, wait_end, weight_begin, weight_end
  waits    int32 [W, 3]  counter, base, per_step      (ready in step e when counters[c] >= e*per_step + base)
  weights  int64 [P, 6]  op, role, dim, start, stop, nbytes (negative when ``dynamic``: the index along
                         dim 0 — routed expert, token row — is known only at run time)
  counters int64 [C]     zeros once at allocation, never reset between steps (int64: int32 would wrap
                         after ~2^31 / per_step steps of a long-lived persistent launch)
  ticket   int32 [1]     the global queue: ticket q is task q % N of step q // N
``roles[op]`` lists the weight role names of op ``op`` (the ``role`` column indexes it); ``opcodes``
the (kind, stage) of each opcode. A worker loop, per ticket: load the descriptor row, issue the rows
weights[weight_begin:weight_end] (L2 prefetch / async copies into its ring), spin on
waits[wait_begin:wait_end], run the tile function for ``opcode`` on ``(op, tile)``, then atomically
add 1 to counters[counter] with release semantics.
"""

from __future__ import annotations

import torch

from nonstop.runtime.megakernel.schedule import Schedule

TASK_FIELDS = ("opcode", "op", "stage", "tile", "counter", "wait_begin", "wait_end", "weight_begin", "weight_end")


def encode(s: Schedule, device="cpu") -> dict:
    roles: list[list[str]] = [[] for _ in s.ops]
    rows, waits, weights = [], [], []
    for t in s.tasks:
        w0, p0 = len(waits), len(weights)
        waits += [(w.counter, w.base, w.per_step) for w in t.waits]
        for w in t.weights:
            if w.role not in roles[t.op]:
                roles[t.op].append(w.role)
            weights.append((t.op, roles[t.op].index(w.role), w.dim, w.start, w.stop, -w.nbytes if w.dynamic else w.nbytes))
        rows.append((t.opcode, t.op, t.stage, t.tile, t.counter, w0, len(waits), p0, len(weights)))
    return {
        "tasks": torch.tensor(rows, dtype=torch.int32, device=device).view(-1, len(TASK_FIELDS)),
        "waits": torch.tensor(waits, dtype=torch.int32, device=device).view(-1, 3),
        "weights": torch.tensor(weights, dtype=torch.int64, device=device).view(-1, 6),
        "counters": torch.zeros(len(s.counters), dtype=torch.int64, device=device),
        "ticket": torch.zeros(1, dtype=torch.int32, device=device),
        "roles": roles,
        "opcodes": list(s.opcodes),
    }


def describe_task(enc: dict, i: int) -> dict:
    """One descriptor row decoded (for debugging and tests)."""
    row = dict(zip(TASK_FIELDS, enc["tasks"][i].tolist()))
    row["waits"] = [tuple(w) for w in enc["waits"][row["wait_begin"] : row["wait_end"]].tolist()]
    row["weights"] = [(enc["roles"][w[0]][w[1]], *w[2:]) for w in enc["weights"][row["weight_begin"] : row["weight_end"]].tolist()]
    return row
