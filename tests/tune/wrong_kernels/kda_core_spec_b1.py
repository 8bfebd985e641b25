"""kda_core: the built-in launch, except in a speculative step (keep_states) of one sequence, where it runs twice
(the recurrent state advances by 2T tokens: the output and every stored state are wrong)."""

from nonstop.kernels.kda import kda_core as builtin


def launch(op, env):
    builtin(op, env)
    if env.batch.keep_states and env.B == 1:
        builtin(op, env)
