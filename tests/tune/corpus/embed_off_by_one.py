"""WRONG (embed): gathers the row after the token's (an off-by-one index).
kind: embed
expect: dynamic: differ from the twin"""

import triton
import triton.language as tl


@triton.jit
def _gather(ids_ptr, table_ptr, stride_t, out_ptr, stride_o, V, D, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    tok = (tl.load(ids_ptr + row) + 1) % V
    cols = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + row * stride_o + cols, tl.load(table_ptr + tok * stride_t + cols, mask=cols < D), mask=cols < D)


def launch(op, env):
    ids, table, out = env.buf[op.reads[0]], op.weights["embed"], env.buf[op.writes[0]]
    _gather[(ids.shape[0],)](
        ids,
        table,
        table.stride(0),
        out,
        out.stride(0),
        table.shape[0],
        table.shape[1],
        BLOCK_D=triton.next_power_of_2(table.shape[1]),
    )
