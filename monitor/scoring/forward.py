"""Teacher-forced scoring of one checkpoint under spec `lstar-score/1` (docs/measurement.md §1).

Reads top to bottom: the spec and its resolution against a model, the window plan (a pure
function), the output head (logits in chunks, never a full `[batch, length, vocab]` float32
tensor), the Token Constraint Bound, and the scoring loop that batches the windows of all
documents by length.

Numerics: the model runs in the resolved dtype (`monitor.scoring.precision`: bf16 on a GPU of
compute capability 8 or later, float32 on older GPUs and the CPU, unless asked);
logits come out of the output matmul in that dtype, the log-softmax is taken in float32
(float64 for a float64 model), and per-token NLLs are summed in float64 on the host, in a
fixed order, so a score does not depend on the device's scheduling of atomic adds. A
float32 spec runs its matmuls in full float32 whatever the process-wide setting (no TF32,
no bf16 passes).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from monitor import DEFAULT_MAX_CONTEXT, SCORING_SPEC_VERSION
from monitor.errors import ModelLoadError, SpecError
from monitor.scoring.host_memory import keep_freed_memory
from monitor.scoring.precision import resolve_device, resolve_dtype  # noqa: F401  (the one rule; re-exported)

# Logit elements per loss chunk: 2**24 float32 values = 64 MiB, whatever the vocabulary.
DEFAULT_LOGITS_CHUNK = 1 << 24
# Vocabulary rows per Token Constraint Bound chunk.
DEFAULT_TCB_CHUNK = 16384

_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def exp_underflow_cutoff(dtype: torch.dtype) -> float:
    """A logit gap below which exp() is exactly +0 in `dtype`: eight nats under the log of the
    smallest subnormal (float32: -111.3, where exp is about 1/3000 of that subnormal, so any
    exp within an ulp or two rounds it to 0)."""
    info = torch.finfo(dtype)
    return math.log(info.smallest_normal * info.eps) - 8.0


def exp_in_place(z: torch.Tensor) -> torch.Tensor:
    """`z.exp_()`, element for element the same values (+0 included), quicker on the CPU.

    The CPU's exp takes a slow path for inputs whose result underflows (measured ~10 ns an
    element against ~0.6 for the rest), and the lab's models give two thirds of gpt2's 50,257
    ids a logit of about -10,000 (`monitor.lab.model.UNUSED_BIAS`): most of a head's exp time
    went there. Elements below `exp_underflow_cutoff` are set to 0 before the exp and to +0,
    what exp gives them, after it (NaN is not below anything: it stays NaN). The demo's score
    of 62,788 tokens: about 48 CPU-seconds in the head before, 35 after. A GPU's exp has no
    such slow path, and the two fills would only add memory traffic: there it is `exp_()`."""
    if z.device.type != "cpu":
        return z.exp_()
    cutoff = exp_underflow_cutoff(z.dtype)
    if z.numel() and bool(z.amin() >= cutoff):
        # nothing underflows (a NaN makes the minimum NaN and takes the masks): the masks
        # would change nothing, and building them cost three passes to the exp's one; the
        # live rows of the demo's heads (`_nll_live`) have gaps of -20 at most
        return z.exp_()
    underflows = z < cutoff
    return z.masked_fill_(underflows, 0.0).exp_().masked_fill_(underflows, 0.0)


# --------------------------------------------------------------------------- spec


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a resolved dtype name."""
    return _TORCH_DTYPES[name]


@dataclass(frozen=True)
class ResolvedSpec:
    """A spec bound to one model: every choice made, nothing left on 'auto'."""

    window: int
    stride: int
    disjoint: bool
    dtype: str
    device: str
    batch_size: int
    tcb_positions: int
    tcb_seed: int
    max_context: int | None = None
    model_max_positions: int | None = None
    logits_chunk: int = DEFAULT_LOGITS_CHUNK
    version: str = SCORING_SPEC_VERSION

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch_dtype(self.dtype)

    def as_dict(self) -> dict[str, Any]:
        """The spec as stored with a score."""
        return asdict(self)


@dataclass
class ScoringSpec:
    """What the user asked for. `max_context=None` means the default (2048, capped by the
    model); an explicit value larger than the model's maximum positions is an error."""

    max_context: int | None = None
    stride: int | None = None
    disjoint: bool = False
    dtype: str = "auto"
    device: str = "auto"
    batch_size: int = 8
    tcb_positions: int = 256
    tcb_seed: int = 0
    logits_chunk: int = DEFAULT_LOGITS_CHUNK

    def validate(self) -> None:
        """Check everything that does not need the model (run before loading it)."""
        if self.max_context is not None and self.max_context < 1:
            raise SpecError(f"--max-context must be at least 1, got {self.max_context}")
        if self.stride is not None and self.stride < 1:
            raise SpecError(f"--stride must be at least 1, got {self.stride}")
        if self.batch_size < 1:
            raise SpecError(f"batch size must be at least 1, got {self.batch_size}")
        if self.tcb_positions < 0:
            raise SpecError(f"TCB positions must be 0 or more, got {self.tcb_positions}")
        if self.logits_chunk < 1:
            raise SpecError(f"logits chunk must be at least 1 element, got {self.logits_chunk}")
        resolve_dtype(self.dtype, resolve_device(self.device))

    def resolve(self, model_max_positions: int | None) -> ResolvedSpec:
        """Bind the spec to a model: window L = min(model max positions, max_context),
        stride S = L // 2 by default, S = L in disjoint mode; dtype and device chosen once."""
        self.validate()
        if self.max_context is None:
            window = DEFAULT_MAX_CONTEXT
            if model_max_positions is not None:
                window = min(window, model_max_positions)
        else:
            window = self.max_context
            if model_max_positions is not None and window > model_max_positions:
                raise SpecError(
                    f"window {window} is larger than the model's maximum positions {model_max_positions}",
                    hint=f"use --max-context {model_max_positions} or less")
        if self.disjoint:
            if self.stride is not None and self.stride != window:
                raise SpecError(f"--stride {self.stride} conflicts with --disjoint (stride = window = {window})",
                                hint="drop --stride or --disjoint")
            stride = window
        else:
            stride = self.stride if self.stride is not None else max(1, window // 2)
        if not 1 <= stride <= window:
            raise SpecError(f"stride {stride} must be between 1 and the window {window}",
                            hint=f"use --stride {max(1, window // 2)} or --disjoint")
        device = resolve_device(self.device)
        return ResolvedSpec(window=window, stride=stride, disjoint=stride == window,
                            dtype=resolve_dtype(self.dtype, device), device=device,
                            batch_size=self.batch_size, tcb_positions=self.tcb_positions,
                            tcb_seed=self.tcb_seed, max_context=self.max_context,
                            model_max_positions=model_max_positions, logits_chunk=self.logits_chunk)


# --------------------------------------------------------------------------- windows


def plan_windows(n_seq: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """Forward passes over one sequence `seq` of `n_seq` tokens (prefix included).

    Each pass is `(start, end, first)`: it reads `seq[start:end]` and scores positions
    `first..end` (inclusive), position q being predicted from `seq[:q]` (the logit at input
    row q-1-start, target `seq[q]`). The first pass reads `seq[0:L]` and scores 1..L; each
    later pass scores the next S positions (a, b] reading the L tokens `seq[b-L:b]`. Every
    position 1..n_seq-1 is scored exactly once; the last pass may score fewer than S.
    """
    if window < 1 or not 1 <= stride <= window:
        raise SpecError(f"invalid window plan: window {window}, stride {stride}")
    last = n_seq - 1
    if last < 1:
        return []
    end = min(window, last)
    passes = [(0, end, 1)]
    while end < last:
        scored_after = end
        end = min(scored_after + stride, last)
        passes.append((end - window, end, scored_after + 1))
    return passes


# --------------------------------------------------------------------------- output head


class OutputHead:
    """The model's output layer as used for scoring: W (tied or not), an optional bias, and
    the logit transforms some families apply after the matmul (Cohere's logit scale,
    Granite's logits scaling, Gemma's final soft-capping)."""

    def __init__(self, model: torch.nn.Module) -> None:
        head = model.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None:
            raise ModelLoadError(f"{type(model).__name__} has no output embedding to score with")
        self.weight: torch.Tensor = head.weight  # [V, d]
        bias = getattr(head, "bias", None)
        self.bias: torch.Tensor | None = bias if isinstance(bias, torch.Tensor) else None
        config = model.config
        scale = 1.0
        if isinstance(getattr(model, "logit_scale", None), (int, float)):
            scale *= float(model.logit_scale)
        if getattr(config, "logits_scaling", None):
            scale /= float(config.logits_scaling)
        self.scale = scale
        self.softcap: float | None = getattr(config, "final_logit_softcapping", None) or None
        self._buffer: torch.Tensor | None = None
        self._live: _LiveRows | None | bool = False     # False: not looked for yet

    @property
    def vocab_size(self) -> int:
        return int(self.weight.shape[0])

    @property
    def accumulator_dtype(self) -> torch.dtype:
        """float32 for bf16, float16 and float32 weights; float64 for float64 weights (a
        reference computation must not lose precision in the head)."""
        return torch.promote_types(self.weight.dtype, torch.float32)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [n, V] of hidden states [n, d] in the accumulator dtype; the matmul runs in
        the model dtype."""
        hidden = hidden.to(self.weight.device)   # a model spread over GPUs ends on the last one
        out = torch.empty((hidden.shape[0], self.vocab_size), dtype=self.accumulator_dtype,
                          device=hidden.device)
        return self._logits_into(hidden, out)

    def _logits_into(self, hidden: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if self.weight.dtype == out.dtype:
            # straight into `out`: no fresh [n, V] allocation per chunk
            if self.bias is None:
                torch.mm(hidden, self.weight.T, out=out)
            else:
                torch.addmm(self.bias, hidden, self.weight.T, out=out)
        else:
            out.copy_(F.linear(hidden, self.weight, self.bias))
        if self.scale != 1.0:
            out.mul_(self.scale)
        if self.softcap:
            out.div_(self.softcap).tanh_().mul_(self.softcap)
        return out

    def nll(self, hidden: torch.Tensor, targets: torch.Tensor, chunk_elements: int) -> torch.Tensor:
        """Per-position NLL ([n], in `accumulator_dtype`: float32 unless the head is float64)
        of `targets` given hidden states [n, d], computed a chunk of positions at a time so
        at most `chunk_elements` logits exist at once (with bf16 weights the matmul's own
        bf16 output of one chunk exists beside them).

        One logits buffer serves every chunk and the log-sum-exp runs in place on it
        (max, subtract, exp, sum); the buffer is kept for the next call. On the CPU a fresh
        [c, V] block per chunk costs more in page faults than its exp does.

        The exp is `exp_in_place`'s: the values of `exp_()`, without its slow path on the
        CPU for the gaps to the peak that underflow to 0.

        A head with dead rows (`find_live_rows`: the lab's unused ids) computes the logits and
        exps of its live rows alone wherever that gives the same values (`_nll_live`)."""
        # Under device_map="auto" the body's last layer may sit on another GPU than the head.
        hidden, targets = hidden.to(self.weight.device), targets.to(self.weight.device)
        rows = max(1, chunk_elements // self.vocab_size)
        n = hidden.shape[0]
        dtype = self.accumulator_dtype
        out = torch.empty(n, dtype=dtype, device=hidden.device)
        buffer = self._buffer
        if (buffer is None or buffer.shape[0] < min(rows, n) or buffer.device != hidden.device
                or buffer.dtype != dtype):
            buffer = torch.empty((min(rows, n), self.vocab_size), dtype=dtype, device=hidden.device)
            self._buffer = buffer
        if self._live is False:
            self._live = find_live_rows(self)
        live = self._live
        for lo in range(0, n, rows):
            h = hidden[lo:lo + rows]
            if live is not None:
                if _nll_live(live, h, targets[lo:lo + rows], buffer, out[lo:lo + rows]):
                    continue
                live.zeroed = None          # the full computation below writes the dead columns
            z = self._logits_into(h, buffer[:h.shape[0]])                 # [c, V] accumulator dtype
            target_logit = z.gather(1, targets[lo:lo + rows, None]).squeeze(1)
            peak = z.amax(dim=1)
            exp_in_place(z.sub_(peak[:, None]))
            out[lo:lo + rows] = peak + z.sum(dim=1).log() - target_logit
        return out


# A head is computed on its live rows alone when at least this share of its rows is dead.
LIVE_ROWS_MIN_DEAD = 0.5


@dataclass
class _LiveRows:
    """The live rows of an output layer whose other rows are dead: a zero weight row, so the
    logit is the row's bias exactly whatever the hidden state, and a bias below
    `exp_underflow_cutoff`, so that logit's gap to a row's peak underflows to +0 in the exp
    (the lab saves the ids it never saw so: `monitor.lab.model.UNUSED_BIAS`)."""

    index: torch.Tensor        # [L] the live ids, ascending
    position: torch.Tensor     # [V] each id's column among the live ones; -1 for a dead id
    weight: torch.Tensor       # [L, d]
    bias: torch.Tensor         # [L]
    dead_max: torch.Tensor     # 0-dim: the largest dead row's logit (its bias)
    logits: torch.Tensor | None = None       # [rows, L], reused from chunk to chunk
    zeroed: torch.Tensor | None = None       # the [rows, V] buffer whose dead columns hold +0


def find_live_rows(head: OutputHead) -> _LiveRows | None:
    """The head's live rows, or None where computing them alone would not pay or could give
    other values: on a GPU (no slow exp to avoid), with a logit scale or soft-cap, with
    weights other than float32, or fewer than `LIVE_ROWS_MIN_DEAD` dead rows. float32 only:
    there a column of the CPU's matmul was measured the same whatever the other columns
    (`tests/test_head_exp.py`), while float64's differed in the last bits from 2,538 of
    500,000 logits when given a third of the rows."""
    weight, bias, dtype = head.weight.detach(), head.bias, head.accumulator_dtype
    if (bias is None or weight.device.type != "cpu" or weight.dtype != torch.float32 or dtype != torch.float32
            or head.scale != 1.0 or head.softcap or weight.dim() != 2):
        return None
    bias, vocab = bias.detach(), weight.shape[0]
    # the bias first: a model whose biases are ordinary stops here, its weights unread
    dead = bias < exp_underflow_cutoff(dtype)
    if int(dead.sum()) < LIVE_ROWS_MIN_DEAD * vocab:
        return None
    for lo in range(0, vocab, 4096):    # a block of rows at a time: no [V, d] temporary
        dead[lo:lo + 4096] &= ~(weight[lo:lo + 4096] != 0).any(dim=1)
    n_dead = int(dead.sum())
    if n_dead < LIVE_ROWS_MIN_DEAD * vocab or n_dead == vocab:
        return None
    index = torch.nonzero(~dead).squeeze(1)
    position = torch.full((weight.shape[0],), -1, dtype=torch.int64)
    position[index] = torch.arange(len(index))
    return _LiveRows(index=index, position=position, weight=weight[index].contiguous(),
                     bias=bias[index].contiguous(), dead_max=bias[dead].max())


def _nll_live(live: _LiveRows, hidden: torch.Tensor, targets: torch.Tensor, buffer: torch.Tensor,
              out: torch.Tensor) -> bool:
    """`OutputHead.nll` of one chunk from the live rows alone, into `out`; False (nothing
    written) where that could differ from the full computation.

    The same values, op for op: the live logits are the full matmul's columns (each is its
    own dot product plus bias); the peak is theirs when every dead logit's gap to it
    underflows (checked per row, as the full computation's subtraction gives it; the largest
    dead logit's gap is the largest); the dead columns' exps are then +0, held in `buffer`,
    and the live exps are written between them, so the sum adds the same values in the same
    order. A hidden state that is not finite, or a target on a dead row, takes the full path.
    The demo's score of its 78 documents (62,788 tokens; 16,242 of gpt2's 50,257 ids live),
    measured on a loaded 2-core machine for checkpoints 95, 665 and 1139: 47.0, 48.2 and 48.1
    CPU-seconds whole, 20.3, 23.1 and 22.8 on the live rows (17.7 to 19.4 with the unmasked
    exp of `exp_in_place`), the NLLs and TCB values bit-identical."""
    c = hidden.shape[0]
    position = live.position[targets]
    if bool((position < 0).any()) or not bool(torch.isfinite(hidden).all()):
        return False
    if live.logits is None or live.logits.shape[0] < c:
        live.logits = torch.empty((c, len(live.index)), dtype=buffer.dtype, device=buffer.device)
    z = live.logits[:c]
    torch.addmm(live.bias, hidden, live.weight.T, out=z)
    peak = z.amax(dim=1)
    if not bool(((live.dead_max - peak) < exp_underflow_cutoff(z.dtype)).all()):
        return False
    target_logit = z.gather(1, position[:, None]).squeeze(1)
    exp_in_place(z.sub_(peak[:, None]))
    if live.zeroed is not buffer:
        buffer.zero_()
        live.zeroed = buffer
    full = buffer[:c]
    # the same values into the same places as `index_copy_(1, live.index, z)`, about twice as
    # quick on the CPU: for the demo's [333, 50,257] chunks with 16,242 live columns, 13 ms of
    # CPU a chunk against 25, about 3 CPU-seconds of a score of its 62,788 tokens
    full.scatter_(1, live.index.expand(c, -1), z)
    out.copy_(peak + full.sum(dim=1).log() - target_logit)
    return True


def decoder_body(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer body whose output is the final (normed) hidden state."""
    body = model.base_model
    if body is model:
        raise ModelLoadError(f"{type(model).__name__} has no separate decoder body to score with",
                             hint="score a *ForCausalLM checkpoint of a standard architecture")
    return body


def _final_hidden(body: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    out = body(input_ids=ids, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def check_head_matches_model(model: torch.nn.Module, body: torch.nn.Module, head: OutputHead,
                             ids: torch.Tensor) -> None:
    """Refuse to score when body + head do not reproduce the model's own logits (a family
    with an unhandled transform between the last hidden state and the logits)."""
    reference = model(input_ids=ids, use_cache=False).logits.float()
    ours = head.logits(_final_hidden(body, ids).reshape(-1, head.weight.shape[1]))
    ours = ours.reshape(reference.shape).to(reference.device)
    spread = max(1.0, float(reference.abs().max()))
    tolerance = 1e-4 if head.weight.dtype == torch.float32 else 2e-2
    diff = float((ours - reference).abs().max())
    if not diff <= tolerance * spread:
        raise ModelLoadError(
            f"{type(model).__name__}: scoring's logits differ from the model's own by {diff:.3g}",
            hint="this architecture transforms its logits in a way lstar-score/1 does not handle")


# --------------------------------------------------------------------------- Token Constraint Bound


@torch.inference_mode()
def token_constraint_bound(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                           chunk: int = DEFAULT_TCB_CHUNK, *, scale: float = 1.0
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """δ_TCB, V_eff and the top-1 − top-2 logit margin for hidden states [P, d].

    With z = scale·(W h + b), o = softmax(z) and μ = Wᵀo (scale folded into W), the Jacobian
    J = ∂o/∂h = (diag(o) − o oᵀ) W has ||J||_F² = Σ_i o_i²||w_i − μ||², expanded as
    Σ o_i²||w_i||² − 2 μ·Wᵀ(o²) + ||μ||² Σ o_i² so only [P, chunk] and [chunk, d]
    temporaries exist. δ_TCB = 1/||J||_F, V_eff = 1/Σ o_i². Everything in float64, in two
    passes over vocabulary chunks (normaliser and top-2 first, then the sums).
    Returns three float64 tensors [P] on the weight's device.
    """
    device = weight.device
    h = hidden.to(device=device, dtype=torch.float64)
    n_pos, vocab = h.shape[0], weight.shape[0]

    def chunk_logits(lo: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = weight[lo:lo + chunk].to(torch.float64) * scale           # [c, d]
        z = h @ w.T                                                     # [P, c]
        if bias is not None:
            z = z + bias[lo:lo + chunk].to(torch.float64) * scale
        return z, w

    running_max = torch.full((n_pos,), -math.inf, dtype=torch.float64, device=device)
    running_sum = torch.zeros(n_pos, dtype=torch.float64, device=device)
    top2 = torch.full((n_pos, 2), -math.inf, dtype=torch.float64, device=device)
    for lo in range(0, vocab, chunk):
        z, _ = chunk_logits(lo)
        new_max = torch.maximum(running_max, z.max(dim=1).values)
        running_sum = running_sum * torch.exp(running_max - new_max) + torch.exp(z - new_max[:, None]).sum(1)
        running_max = new_max
        k = min(2, z.shape[1])
        top2 = torch.cat([top2, z.topk(k, dim=1).values], dim=1).topk(2, dim=1).values
    log_norm = running_max + torch.log(running_sum)

    sum_o2 = torch.zeros(n_pos, dtype=torch.float64, device=device)
    sum_o2_wnorm2 = torch.zeros(n_pos, dtype=torch.float64, device=device)
    mu = torch.zeros_like(h)           # Wᵀ o
    nu = torch.zeros_like(h)           # Wᵀ (o²)
    for lo in range(0, vocab, chunk):
        z, w = chunk_logits(lo)
        o = torch.exp(z - log_norm[:, None])
        o2 = o * o
        sum_o2 += o2.sum(1)
        sum_o2_wnorm2 += o2 @ (w * w).sum(1)
        mu += o @ w
        nu += o2 @ w
    jac_f2 = sum_o2_wnorm2 - 2.0 * (mu * nu).sum(1) + (mu * mu).sum(1) * sum_o2
    tcb = 1.0 / torch.sqrt(jac_f2.clamp_min(0.0))
    return tcb, 1.0 / sum_o2, top2[:, 0] - top2[:, 1]


# --------------------------------------------------------------------------- scoring loop


@dataclass
class ScoreOutput:
    """Per-document results of one scoring run, plus TCB values at the sampled positions."""

    doc_nll: np.ndarray            # float64 [n_docs], nats
    doc_ntok: np.ndarray           # int64 [n_docs], scored tokens
    tcb: np.ndarray | None         # float64 [k] at the sampled positions (None without TCB)
    v_eff: np.ndarray | None
    margin: np.ndarray | None
    n_tokens: int
    wall_s: float
    tokens_per_s: float
    n_windows: int = 0
    n_input_tokens: int = 0
    tcb_index: np.ndarray | None = None   # int64 [k]: flat index of each sampled scored position
    # CUDA only: most bytes the caching allocator held in tensors during the call (weights
    # included), from torch.cuda.max_memory_allocated; None on the CPU
    peak_memory_bytes: int | None = None


@dataclass(frozen=True)
class _Pass:
    doc: int
    start: int
    end: int
    first: int


@dataclass
class _Batch:
    """Host-side arrays of one batch of passes, right-padded to the longest."""

    ids: np.ndarray          # int64 [B, T] model input
    rows: np.ndarray         # int64 [M] rows of the flattened [B*T] output that are scored
    targets: np.ndarray      # int64 [M] the token each scored row predicts
    owner: np.ndarray        # int64 [M] document of each scored row
    tcb_slots: np.ndarray    # int64 [k'] positions in the TCB sample that fall in this batch
    tcb_rows: np.ndarray     # int64 [k'] their rows in the flattened output
    n_input: int             # real (unpadded) input tokens


def _make_batch(passes: Sequence[_Pass], seqs: Sequence[np.ndarray], doc_offset: np.ndarray,
                sample: np.ndarray) -> _Batch:
    width = max(p.end - p.start for p in passes)
    ids = np.zeros((len(passes), width), dtype=np.int64)
    rows, targets, owner, slots, tcb_rows = [], [], [], [], []
    for i, p in enumerate(passes):
        n = p.end - p.start
        ids[i, :n] = seqs[p.doc][p.start:p.end]
        local = np.arange(p.first - 1 - p.start, n) + i * width     # rows predicting first..end
        rows.append(local)
        targets.append(seqs[p.doc][p.first:p.end + 1])
        owner.append(np.full(len(local), p.doc, dtype=np.int64))
        flat_lo = doc_offset[p.doc] + p.first - 1                   # flat index of position `first`
        a, b = np.searchsorted(sample, [flat_lo, flat_lo + len(local)])
        slots.append(np.arange(a, b, dtype=np.int64))
        tcb_rows.append(local[sample[a:b] - flat_lo])
    return _Batch(ids=ids, rows=np.concatenate(rows), targets=np.concatenate(targets),
                  owner=np.concatenate(owner), tcb_slots=np.concatenate(slots),
                  tcb_rows=np.concatenate(tcb_rows), n_input=sum(p.end - p.start for p in passes))


def sample_tcb_positions(n_scored: int, k: int, seed: int) -> np.ndarray:
    """Sorted flat indices (document order, then position) of the TCB sample: a seeded
    draw without replacement, so the sample never depends on batching."""
    k = min(k, n_scored)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.sort(rng.choice(n_scored, size=k, replace=False)).astype(np.int64)


@contextlib.contextmanager
def full_precision_float32(dtype: torch.dtype):
    """Within the block, float32 matmuls run in full float32 when `dtype` is float32.

    `torch.set_float32_matmul_precision("high")` anywhere in the process (a library, a
    notebook) lets CUDA use TF32 and lets the CPU use bf16 passes for float32 matmuls; a
    score that records dtype float32 must not be computed that way. The previous setting is
    restored on exit."""
    if dtype != torch.float32:
        yield
        return
    # torch ≥ 2.9 has per-backend settings (`fp32_precision`); once anything sets those,
    # reading the legacy global setting raises, so the new ones are saved and set when present.
    backends = [b for b in (getattr(torch.backends.cuda, "matmul", None), getattr(torch.backends, "mkldnn", None))
                if b is not None and hasattr(b, "fp32_precision")]
    if backends:
        saved = [b.fp32_precision for b in backends]
        for b in backends:
            b.fp32_precision = "ieee"
        try:
            yield
        finally:
            for b, value in zip(backends, saved):
                b.fp32_precision = value
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _progress_bar(enabled: bool):
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                               TimeRemainingColumn)
    from rich.text import Text

    class TokensPerSecond(ProgressColumn):
        def render(self, task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("-- tok/s" if speed is None else f"{speed:,.0f} tok/s", style="progress.data.speed")

    return Progress(TextColumn("[bold]scoring"), BarColumn(), MofNCompleteColumn(), TextColumn("tokens"),
                    TokensPerSecond(), TimeRemainingColumn(), console=Console(stderr=True),
                    disable=not enabled, transient=False)


@torch.inference_mode()
def score_token_sequences(model: torch.nn.Module, token_seqs: Sequence[Sequence[int]],
                          prefix_token_id: int | None, resolved_spec: ResolvedSpec, *,
                          with_tcb: bool = True, progress: bool = True) -> ScoreOutput:
    """Teacher-forced NLL of every document under `resolved_spec`.

    Each document is `[prefix] + tokens` (just `tokens` when `prefix_token_id` is None, so
    its first token is not scored). The passes of all documents are sorted by length and
    batched with right padding; a scored row never sees a pad token or another pass's
    tokens, so the results do not depend on the batch size or the padding. The model must
    already be on the spec's device in the spec's dtype (monitor.scoring.loader does this).
    TCB values come from the sampled positions' final hidden states and the output layer
    (scale folded in; a final soft-cap, where a family has one, is not part of the bound).
    """
    spec = resolved_spec
    device = torch.device(spec.device)
    if device.type == "cpu":
        keep_freed_memory()     # activations reused between batches, not page-faulted in again
    body, head = decoder_body(model), OutputHead(model)
    elsewhere = sorted({p.device.type for p in model.parameters()} - {device.type})
    if elsewhere:
        # device_map="auto" offloads what the GPUs cannot hold to the CPU or disk ("meta").
        raise ModelLoadError(f"parts of the model are on {', '.join(elsewhere)}, not on {device.type}: it does "
                             "not fit in this machine's GPU memory",
                             hint="score it on a node with more GPU memory; offloaded layers are not scored")
    if head.weight.dtype != spec.torch_dtype or head.weight.device.type != device.type:
        raise SpecError(f"the model is loaded as {str(head.weight.dtype).removeprefix('torch.')} on "
                        f"{head.weight.device.type} but the spec says {spec.dtype} on {device.type}",
                        hint="load the checkpoint with the spec's dtype and device")
    seqs = [np.asarray(([prefix_token_id] if prefix_token_id is not None else []) + list(t), dtype=np.int64)
            for t in token_seqs]
    n_docs = len(seqs)
    doc_ntok = np.array([max(0, len(s) - 1) for s in seqs], dtype=np.int64)
    n_tokens = int(doc_ntok.sum())
    # flat index of a scored position q of document d: doc_offset[d] + q - 1
    doc_offset = np.concatenate([[0], np.cumsum(doc_ntok)[:-1]]).astype(np.int64) if n_docs else doc_ntok

    passes = [_Pass(d, start, end, first) for d, seq in enumerate(seqs)
              for start, end, first in plan_windows(len(seq), spec.window, spec.stride)]
    # longest first: the largest batch runs first (an out-of-memory shows at once)
    passes.sort(key=lambda p: (-(p.end - p.start), p.doc, p.start))

    sample = sample_tcb_positions(n_tokens, spec.tcb_positions if with_tcb else 0, spec.tcb_seed)
    sampled_hidden = torch.zeros((len(sample), head.weight.shape[1]), dtype=torch.float32,
                                 device=head.weight.device)

    # Summed on the host in row order: index_add_ on a CUDA tensor uses atomic adds, whose
    # order (and so the last bits of a float64 sum) changes from run to run.
    doc_nll = np.zeros(n_docs, dtype=np.float64)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    with full_precision_float32(spec.torch_dtype):
        if passes:
            check_ids = torch.from_numpy(seqs[passes[-1].doc][passes[-1].start:passes[-1].end][:16]).to(device)
            check_head_matches_model(model, body, head, check_ids[None, :])
        n_input, wall_s = _score_passes(body, head, passes, seqs, doc_offset, sample, spec,
                                        doc_nll, sampled_hidden, progress=progress)

        tcb = v_eff = margin = None
        if with_tcb and len(sample) == 0:
            tcb, v_eff, margin = (np.zeros(0, dtype=np.float64) for _ in range(3))
        elif with_tcb:
            values = token_constraint_bound(sampled_hidden, head.weight, head.bias, scale=head.scale)
            tcb, v_eff, margin = (v.cpu().numpy().astype(np.float64) for v in values)
    peak = int(torch.cuda.max_memory_allocated(device)) if cuda else None
    return ScoreOutput(doc_nll=doc_nll, doc_ntok=doc_ntok, tcb=tcb, v_eff=v_eff, margin=margin,
                       n_tokens=n_tokens, wall_s=wall_s,
                       tokens_per_s=n_tokens / wall_s if wall_s > 0 else float("nan"),
                       n_windows=len(passes), n_input_tokens=n_input,
                       tcb_index=sample if with_tcb else None, peak_memory_bytes=peak)


def _score_passes(body: torch.nn.Module, head: OutputHead, passes: list[_Pass],
                  seqs: list[np.ndarray], doc_offset: np.ndarray, sample: np.ndarray,
                  spec: ResolvedSpec, doc_nll: np.ndarray, sampled_hidden: torch.Tensor, *,
                  progress: bool) -> tuple[int, float]:
    """The timed loop over batches of passes: adds per-document NLLs into `doc_nll` and
    writes the TCB sample's hidden states into `sampled_hidden`. Returns (input tokens,
    wall seconds); on CUDA the clock is read only after the device has finished."""
    device = torch.device(spec.device)
    n_tokens = int(sum(len(s) - 1 for s in seqs if len(s) > 1))
    n_input = 0
    bar = _progress_bar(progress)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    with bar:
        task = bar.add_task("scoring", total=n_tokens)
        for lo in range(0, len(passes), spec.batch_size):
            batch = _make_batch(passes[lo:lo + spec.batch_size], seqs, doc_offset, sample)
            n_input += batch.n_input
            # Right padding needs no attention mask in a causal decoder: a real token at
            # position t attends to keys 0..t, all real, so pad tokens never reach a scored
            # row (their own rows are never read). Without a mask attention keeps its fused
            # causal kernel instead of materialising a [B, H, T, T] mask.
            ids = torch.from_numpy(batch.ids).to(device)
            hidden = _final_hidden(body, ids).flatten(0, 1)                        # [B*T, d]
            # on the device the body ended on (the last GPU of a model spread over several)
            scored = hidden.index_select(0, torch.from_numpy(batch.rows).to(hidden.device))  # [M, d]
            nll = head.nll(scored, torch.from_numpy(batch.targets), spec.logits_chunk)
            # the copy to the host waits for this batch on the device: a sync per batch,
            # small beside a forward pass, and device memory stays flat whatever the corpus
            np.add.at(doc_nll, batch.owner, nll.cpu().numpy().astype(np.float64))
            if len(batch.tcb_slots):
                sampled_hidden[torch.from_numpy(batch.tcb_slots).to(sampled_hidden.device)] = hidden.index_select(
                    0, torch.from_numpy(batch.tcb_rows).to(hidden.device)).to(sampled_hidden.device).float()
            bar.advance(task, len(batch.rows))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n_input, time.perf_counter() - t0
