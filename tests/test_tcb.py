"""Token Constraint Bound: the closed form against the explicit Jacobian from torch.autograd."""

from __future__ import annotations

import numpy as np
import pytest
from lanes import fast_first
import torch
from tokenizers import Tokenizer

from monitor.lab.tiny_models import build_tiny_model
from monitor.scoring.forward import ScoringSpec, score_token_sequences, token_constraint_bound
from monitor.scoring.loader import load_checkpoint

# torch.autograd.functional.jacobian(vectorize=True) goes through torch internals that warn
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")

TEXT = "def add(a, b):\n    return a + b\n\nTo be, or not to be, that is the question."


def explicit_jacobian_stats(hidden, weight, bias):
    """||∂softmax(W h + b)/∂h||_F, V_eff and top-2 margin, per position, the slow way: the
    full [V, d] Jacobian from torch.autograd in float64."""
    w = weight.detach().double()
    b = None if bias is None else bias.detach().double()
    norms, v_eff, margin = [], [], []
    for h in hidden.detach().double():
        def probs(x):
            z = w @ x
            return torch.softmax(z if b is None else z + b, dim=-1)

        jac = torch.autograd.functional.jacobian(probs, h, vectorize=True, strategy="forward-mode")
        assert jac.shape == (w.shape[0], w.shape[1])
        norms.append(float(torch.linalg.matrix_norm(jac, ord="fro")))
        o = probs(h)
        v_eff.append(float(1.0 / (o * o).sum()))
        z = w @ h + (0 if b is None else b)
        top = torch.topk(z, 2).values
        margin.append(float(top[0] - top[1]))
    return 1.0 / np.array(norms), np.array(v_eff), np.array(margin)


@pytest.fixture(scope="module", params=fast_first([
    pytest.param((False, True), id="untied-bias"),  # the fast lane's case: a bias, no tying
    pytest.param((False, False), id="untied"), pytest.param((True, True), id="tied-bias")]))
def model_and_hidden(request, tmp_path_factory, shared_dir):
    """A tiny real model and its final hidden states on a real text."""
    tied, bias = request.param
    tok_dir = shared_dir / "tokenizers" / "gpt2"
    out = build_tiny_model(tmp_path_factory.mktemp("tcb"), tok_dir, arch="llama", seed=11,
                           tie_embeddings=tied, lm_head_bias=bias, init_std=0.3)
    ckpt = load_checkpoint(str(out), dtype="float32", device="cpu")
    assert ckpt.tied_embeddings == tied and ckpt.lm_head_bias == bias
    ids = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).encode(TEXT).ids
    with torch.no_grad():
        hidden = ckpt.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0]
    return ckpt, ids, hidden[:6]


def test_closed_form_equals_autograd_jacobian(model_and_hidden):
    ckpt, _, hidden = model_and_hidden
    head = ckpt.model.get_output_embeddings()
    # a vocabulary chunk smaller than (and not dividing) the vocabulary
    tcb, v_eff, margin = token_constraint_bound(hidden, head.weight, head.bias, chunk=7001)
    ref_tcb, ref_v_eff, ref_margin = explicit_jacobian_stats(hidden, head.weight, head.bias)
    np.testing.assert_allclose(tcb.numpy(), ref_tcb, rtol=1e-5)
    np.testing.assert_allclose(v_eff.numpy(), ref_v_eff, rtol=1e-5)
    np.testing.assert_allclose(margin.numpy(), ref_margin, rtol=1e-5, atol=1e-9)
    assert tcb.dtype == torch.float64 and np.all(margin.numpy() >= 0)


def test_chunking_does_not_change_the_bound(model_and_hidden):
    ckpt, _, hidden = model_and_hidden
    head = ckpt.model.get_output_embeddings()
    whole = token_constraint_bound(hidden, head.weight, head.bias, chunk=head.weight.shape[0])
    for chunk in (1000, 4096, 50257 // 2 + 1):
        parts = token_constraint_bound(hidden, head.weight, head.bias, chunk=chunk)
        for a, b in zip(whole, parts):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-10)


def test_peaked_distribution_stays_finite_and_correct(model_and_hidden):
    """A sharper softmax (hidden state scaled up) makes the expansion's terms cancel more;
    float64 keeps the bound accurate."""
    ckpt, _, hidden = model_and_hidden
    head = ckpt.model.get_output_embeddings()
    sharp = hidden * 4.0
    tcb, v_eff, _ = token_constraint_bound(sharp, head.weight, head.bias, chunk=5000)
    ref_tcb, ref_v_eff, _ = explicit_jacobian_stats(sharp, head.weight, head.bias)
    assert np.all(ref_v_eff < 50)               # really peaked compared to V = 50257
    np.testing.assert_allclose(tcb.numpy(), ref_tcb, rtol=1e-5)
    np.testing.assert_allclose(v_eff.numpy(), ref_v_eff, rtol=1e-5)


def test_scoring_reports_the_bound_at_its_sampled_positions(model_and_hidden):
    """End to end: one short document (a single window), so the hidden state at scored
    position q is the model's output at input row q-1; TCB there equals the Jacobian's."""
    ckpt, ids, _ = model_and_hidden
    prefix = 50256                                           # gpt2 <|endoftext|>
    spec = ScoringSpec(max_context=64, device="cpu", tcb_positions=5, tcb_seed=2).resolve(ckpt.max_positions)
    out = score_token_sequences(ckpt.model, [ids], prefix, spec, progress=False)
    seq = [prefix] + ids
    assert len(seq) - 1 <= spec.window
    with torch.no_grad():
        hidden = ckpt.model(input_ids=torch.tensor([seq[:-1]]), output_hidden_states=True).hidden_states[-1][0]
    rows = out.tcb_index                                    # flat index = q - 1 for a single document
    head = ckpt.model.get_output_embeddings()
    ref_tcb, ref_v_eff, ref_margin = explicit_jacobian_stats(hidden[rows], head.weight, head.bias)
    np.testing.assert_allclose(out.tcb, ref_tcb, rtol=1e-5)
    np.testing.assert_allclose(out.v_eff, ref_v_eff, rtol=1e-5)
    np.testing.assert_allclose(out.margin, ref_margin, rtol=1e-4, atol=1e-6)
