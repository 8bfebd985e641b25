"""The KDA Triton kernels keep the state after every token of a speculative-verification step
(``keep_states``), equal to their twins (under TRITON_INTERPRET=1 on a CPU), and speculative greedy
decoding through them equals plain decoding through them."""

from __future__ import annotations

import warnings

import pytest
import torch

triton = pytest.importorskip("triton")

from nonstop.kernels import kda  # noqa: E402
from nonstop.program.reference import REFERENCE  # noqa: E402
from nonstop.runtime.superop import SuperOpExecutor  # noqa: E402
from tests.kernels.harness import check_kernel  # noqa: E402
from tests.speculative.helpers import generate, tiny_model  # noqa: E402
from tests.tiny_configs import TINY_CONFIGS  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", ["kda_in_proj", "kda_core"])
@pytest.mark.parametrize("config", ["kimi_k3", "kimi_linear", "kimi_linear_layer_types"])
@pytest.mark.parametrize("B,T", [(2, 3), (1, 5)])
def test_kernels_keep_every_token_state(kind, config, B, T):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert (
            check_kernel(kind, TINY_CONFIGS[config], kda.KERNELS[kind], torch.float32, B=B, T=T, keep_states=True) > 0
        )


def test_speculative_greedy_through_the_kda_kernels():
    from nonstop.engine.sampling import SamplingParams
    from tests.speculative.helpers import ScriptedDrafter

    model = tiny_model("kimi_k3")
    ex = SuperOpExecutor(
        model, use_kernels=True, kernels={**REFERENCE, **kda.KERNELS}
    )  # KDA kernels, twins for the rest
    prompts = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [9, 8, 9, 8, 9]]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = generate(model, ex, prompts, params)
        drafter = ScriptedDrafter(
            {o.request_id: o.token_ids for o in want}, 2, model.cfg.vocab_size
        )  # 2 right, then wrong
        got = generate(model, ex, prompts, params, drafter, num_tokens=3, batch_invariant=False)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert sum(o.metrics["accepted_tokens"] for o in got) > 0
