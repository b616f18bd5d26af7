"""The scoring head's exp (`monitor.scoring.forward.exp_in_place`): the values of torch's own
`exp_()` to the bit, +0 and NaN included, and NLLs from `OutputHead.nll` equal to the plain
log-sum-exp (max, subtract, `exp_()`, sum) on the same logits, for a head shaped like the lab's
(unused ids with a zero row and a bias of -10,000)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from monitor.lab.model import UNUSED_BIAS
from monitor.scoring.forward import OutputHead, exp_in_place, exp_underflow_cutoff


def _every_float32_between(lo: float, hi: float) -> torch.Tensor:
    """All float32 values in [lo, hi] (both negative), from their bit patterns."""
    a, b = (torch.tensor([v], dtype=torch.float32).view(torch.int32).item() for v in (hi, lo))
    return torch.arange(a, b + 1, dtype=torch.int32).view(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exp_in_place_gives_exp_s_own_values_to_the_bit(dtype: torch.dtype) -> None:
    cutoff = exp_underflow_cutoff(dtype)
    # by hand: the log of the smallest subnormal (2**-149 in float32, 2**-1074 in float64), less 8
    assert cutoff == pytest.approx((-149 if dtype == torch.float32 else -1074) * math.log(2) - 8)
    g = torch.Generator().manual_seed(0)
    parts = [
        torch.rand(20_000, generator=g, dtype=dtype) * -30,              # ordinary gaps
        torch.rand(20_000, generator=g, dtype=dtype) * (cutoff + 60) - 60,  # subnormal and zero results
        torch.full((5_000,), UNUSED_BIAS, dtype=dtype),                  # the lab's unused ids
        -torch.rand(5_000, generator=g, dtype=dtype) * torch.finfo(dtype).max,
        torch.tensor([0.0, -0.0, cutoff, math.nextafter(cutoff, 0), math.nextafter(cutoff, -math.inf),
                      -math.inf, math.inf, math.nan, 1.0, 80.0], dtype=dtype),
    ]
    if dtype == torch.float32:
        # every float32 from where exp's result becomes subnormal down to 4 below the cutoff
        parts.append(_every_float32_between(cutoff - 4, -87.0))
    z = torch.cat(parts)
    expected = z.clone().exp_()
    got = exp_in_place(z.clone())
    assert torch.equal(got.view(torch.int32 if dtype == torch.float32 else torch.int64),
                       expected.view(torch.int32 if dtype == torch.float32 else torch.int64))
    assert torch.isnan(got[torch.isnan(z)]).all()
    # the results it makes +0 are +0 for exp too, and some just above the cutoff are not 0:
    # the subnormal results are computed, not dropped
    assert (expected[z < cutoff] == 0).all() and not torch.signbit(got[z < cutoff]).any()
    assert (expected[(z > cutoff + 8.5) & (z < cutoff + 30)] > 0).all()
    # where nothing underflows (the live rows of a lab head) it is exp_() itself, no masks
    ordinary = parts[0].clone()
    assert bool(ordinary.amin() >= cutoff)
    assert torch.equal(exp_in_place(ordinary.clone()), ordinary.exp_())


def _lab_shaped_head(vocab: int, width: int, dtype: torch.dtype) -> OutputHead:
    """An output layer as the lab saves one: a third of the ids used, the rest a zero row and
    the bias UNUSED_BIAS; used logits spread wide enough that some gaps underflow too."""
    g = torch.Generator().manual_seed(1)
    linear = torch.nn.Linear(width, vocab, bias=True).to(dtype)
    with torch.no_grad():
        used = torch.randperm(vocab, generator=g)[:vocab // 3]
        weight = torch.zeros(vocab, width, dtype=dtype)
        weight[used] = torch.randn(len(used), width, generator=g, dtype=dtype) * 3
        bias = torch.full((vocab,), UNUSED_BIAS, dtype=dtype)
        bias[used] = torch.randn(len(used), generator=g, dtype=dtype)
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    model = SimpleNamespace(get_output_embeddings=lambda: linear, config=SimpleNamespace())
    return OutputHead(model)   # type: ignore[arg-type]


def _plain_nll(head: OutputHead, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The log-sum-exp as it was computed before `exp_in_place`: the same logits, then max,
    subtract, `exp_()` on everything, sum."""
    z = head.logits(hidden)
    target = z.gather(1, targets[:, None]).squeeze(1)
    peak = z.amax(dim=1)
    return peak + z.sub_(peak[:, None]).exp_().sum(dim=1).log() - target


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_head_nll_equals_the_plain_log_sum_exp_on_a_lab_shaped_head(dtype: torch.dtype) -> None:
    head = _lab_shaped_head(vocab=5_003, width=32, dtype=dtype)
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(300, 32, generator=g, dtype=dtype) * 4
    targets = torch.randint(0, 5_003, (300,), generator=g)
    with torch.inference_mode():
        z = head.logits(hidden)
        gaps = z - z.amax(dim=1, keepdim=True)
        # the case it is for: most gaps underflow, some are in exp's subnormal range or near it
        assert float((gaps < exp_underflow_cutoff(dtype)).float().mean()) > 0.6
        assert bool(((gaps < -20) & (gaps > -200)).any())
        # whole, and in chunks of 7 rows (the matmul's and the sum's last bits may depend on
        # how many rows they are given, so the plain one takes the same chunks)
        for rows in (300, 7):
            expected = torch.cat([_plain_nll(head, hidden[lo:lo + rows], targets[lo:lo + rows])
                                  for lo in range(0, 300, rows)])
            got = head.nll(hidden, targets, rows * 5_003)
            assert got.dtype == dtype and torch.equal(got, expected)


def test_a_lab_shaped_head_computed_on_its_live_rows_gives_the_full_head_s_nlls_to_the_bit() -> None:
    """The lab's heads are scored on their live rows alone (`find_live_rows`; the demo's gpt2
    head has 16,242 of 50,257): the NLLs are the full computation's, bit for bit, on one and
    on two threads, whole and in chunks, and where a chunk cannot be (a target on a dead row,
    a row whose peak is too low for the dead logits to underflow) it takes the full path."""
    from monitor.scoring.forward import find_live_rows

    dtype = torch.float32
    # a float64 head (a reference computation) is computed whole: its matmul's columns differ
    # in the last bits when it is given a third of the rows
    assert find_live_rows(_lab_shaped_head(vocab=5_003, width=32, dtype=torch.float64)) is None
    head = _lab_shaped_head(vocab=5_003, width=32, dtype=dtype)
    live = find_live_rows(head)
    assert live is not None and len(live.index) == 5_003 // 3
    assert bool((head.weight[live.index] != 0).any(dim=1).all()) and float(live.dead_max) == UNUSED_BIAS
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(300, 32, generator=g, dtype=dtype) * 4
    targets = live.index[torch.randint(0, len(live.index), (300,), generator=g)]
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for n_threads in (1, 2):
                torch.set_num_threads(n_threads)
                for rows in (300, 7):
                    full = _lab_shaped_head(vocab=5_003, width=32, dtype=dtype)
                    full._live = None                      # never on the live rows
                    expected = full.nll(hidden, targets, rows * 5_003)
                    assert torch.equal(expected, torch.cat([_plain_nll(head, hidden[lo:lo + rows], targets[lo:lo + rows])
                                                            for lo in range(0, 300, rows)]))
                    fresh = _lab_shaped_head(vocab=5_003, width=32, dtype=dtype)
                    got = fresh.nll(hidden, targets, rows * 5_003)
                    assert fresh._live is not None and fresh._live.zeroed is not None   # the live path ran
                    assert got.dtype == dtype and torch.equal(got, expected), (n_threads, rows)
            # a chunk the live rows cannot give: a target on a dead row (row 5), or every live
            # logit of a row pushed down to where the dead ones' gaps no longer underflow (row 9)
            odd_targets = targets.clone()
            odd_targets[5] = int(torch.nonzero(live.position < 0)[0])
            odd_hidden = hidden.clone()
            odd_hidden[9] = 0.0
            low = _lab_shaped_head(vocab=5_003, width=32, dtype=dtype)
            with torch.no_grad():
                low.bias[live.index] -= 9_999.0   # row 9: dead logits 1 to 4 below its live ones
            for h, t, model in ((hidden, odd_targets, head), (odd_hidden, targets, low)):
                plain = torch.cat([_plain_nll(model, h[lo:lo + 7], t[lo:lo + 7]) for lo in range(0, 300, 7)])
                model._live, model._buffer = False, None
                assert torch.equal(model.nll(h, t, 7 * 5_003), plain)
    finally:
        torch.set_num_threads(threads)
