"""Many bounded trust-region-reflective solves of the sigmoid at once, in lock step.

A sigmoid fit is 12 solves from different starts, and its band one warm-started solve per
bootstrap resample (1,000 by default): thousands of 4-parameter problems of a few dozen rows
whose cost is numpy's per-call overhead, not arithmetic. `trf_bounds_batch` runs B of them
together: every iteration is the same sequence of array operations on (B, ...) arrays, one
batched SVD, and each problem stops where `monitor.curves.small_trf.trf_bounds` (scipy's
`trf_bounds`, step for step) would stop it. A problem that has stopped is carried along
unchanged until the last one stops.

The arithmetic is the scalar loop's, but sums over rows are taken along an axis of a
batch rather than by BLAS's dot, and the SVD is numpy's, so the iterates agree with the scalar
solve to rounding, not to the bit. Both stop by the same tolerances (ftol = xtol = gtol =
1e-8); where a decision sits on a rounding boundary (a reduction of one ulp, a gradient norm at
the tolerance, a singular value that is 0 in one LAPACK and 1e-17 in another) a solve can end a
few steps apart, with another status (about 1 solve in 300 on generic problems).
`tests/test_parametric_solver.py` compares them problem by problem. The rare step that
leaves the bounds (a reflection: a few steps in a hundred from a fit's starts, fewer in a band)
is taken per problem by the scalar loop's own `_select_step`. An error the single solve would
raise (a Jacobian that is not finite, an SVD that does not converge) ends that problem alone,
with the single solve's message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from monitor.curves.small_trf import _select_step

_EPS = np.finfo(float).eps
_RUNNING = -1   # the scalar loop's `termination_status is None`


@dataclass
class BatchResult:
    """Per problem: the solution, its cost, scipy's termination status (> 0 converged, 0 the
    evaluation cap, −1 stopped by an error), the number of residual evaluations, and the error
    the single solve would have raised (None where there was none)."""

    x: np.ndarray
    cost: np.ndarray
    status: np.ndarray
    nfev: np.ndarray
    errors: list[str | None]


def _rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=-1)


def _cl_scaling(x: np.ndarray, g: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coleman-Li scaling vector and its derivative, per row (scipy's `CL_scaling_vector`)."""
    upper = (g < 0) & np.isfinite(ub)
    lower = (g > 0) & np.isfinite(lb)
    with np.errstate(invalid="ignore"):   # x − (±inf) where the mask does not take it
        v = np.where(lower, x - lb, np.where(upper, ub - x, 1.0))
    dv = np.where(lower, 1.0, np.where(upper, -1.0, 0.0))
    return v, dv


def _jac_scale(J: np.ndarray, scale_inv_old: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    scale_inv = np.sqrt(np.einsum("bmn,bmn->bn", J, J))
    if scale_inv_old is None:
        scale_inv = np.where(scale_inv == 0, 1.0, scale_inv)
    else:
        scale_inv = np.maximum(scale_inv, scale_inv_old)
    return 1 / scale_inv, scale_inv


def _nudged_inside(x: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """Coordinates on or past a bound moved to the next float inside it (per row)."""
    upper = x >= ub
    lower = (x <= lb) & ~upper
    if not (upper.any() or lower.any()):
        return x
    lbb, ubb = np.broadcast_to(lb, x.shape), np.broadcast_to(ub, x.shape)
    out = np.where(lower, np.nextafter(lbb, ubb), x)
    out = np.where(upper, np.nextafter(ubb, lbb), out)
    tight = (out < lbb) | (out > ubb)
    return np.where(tight, 0.5 * (lbb + ubb), out)


def _trust_region_steps(m: np.ndarray, uf: np.ndarray, s: np.ndarray, V: np.ndarray, Delta: np.ndarray,
                        alpha0: np.ndarray, rtol: float = 0.01, max_iter: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """scipy's `solve_lsq_trust_region` per row (Moré's method on the row's SVD): the step in the
    scaled variables and the new Levenberg-Marquardt parameter. `m` (k,): each row's number of
    residuals (its rank test)."""
    n = s.shape[1]
    suf = s * uf
    full_rank = (s[:, -1] > _EPS * m * s[:, 0]) & (m >= n)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        p_gn = -np.einsum("bij,bj->bi", V, uf / s)
        inside = full_rank & (np.sqrt(_rowdot(p_gn, p_gn)) <= Delta)

        def phi_and_derivative(alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            denom = s ** 2 + alpha[:, None]
            q = suf / denom
            p_norm = np.sqrt(_rowdot(q, q))
            return p_norm - Delta, -(suf ** 2 / denom ** 3).sum(axis=1) / p_norm

        alpha_upper = np.sqrt(_rowdot(suf, suf)) / Delta
        phi0, phi0_prime = phi_and_derivative(np.zeros(len(s)))
        alpha_lower = np.where(full_rank, -phi0 / phi0_prime, 0.0)
        reset = np.maximum(0.001 * alpha_upper, np.sqrt(alpha_lower * alpha_upper))
        alpha = np.where(~full_rank & (alpha0 == 0), reset, alpha0)
        going = ~inside
        for _ in range(max_iter):
            if not going.any():
                break
            out_of_range = (alpha < alpha_lower) | (alpha > alpha_upper)
            reset = np.maximum(0.001 * alpha_upper, np.sqrt(alpha_lower * alpha_upper))
            a = np.where(going & out_of_range, reset, alpha)
            phi, phi_prime = phi_and_derivative(a)
            alpha_upper = np.where(going & (phi < 0), a, alpha_upper)
            ratio = phi / phi_prime
            alpha_lower = np.where(going, np.maximum(alpha_lower, a - ratio), alpha_lower)
            alpha = np.where(going, a - (phi + Delta) * ratio / Delta, alpha)
            going = going & ~(np.abs(phi) < rtol * Delta)
        p = -np.einsum("bij,bj->bi", V, suf / (s ** 2 + alpha[:, None]))
        p *= (Delta / np.sqrt(_rowdot(p, p)))[:, None]
    p = np.where(inside[:, None], p_gn, p)
    return p, np.where(inside, 0.0, alpha)


def _quadratic(J_h: np.ndarray, g_h: np.ndarray, s: np.ndarray, diag: np.ndarray) -> np.ndarray:
    Js = np.einsum("bmn,bn->bm", J_h, s)
    return 0.5 * (_rowdot(Js, Js) + _rowdot(s * diag, s)) + _rowdot(s, g_h)


def trf_bounds_batch(fun: Callable[[np.ndarray, np.ndarray], np.ndarray],
                     jac: Callable[[np.ndarray, np.ndarray], np.ndarray], x0: np.ndarray, f0: np.ndarray,
                     lb: np.ndarray, ub: np.ndarray, tol: float, max_nfev: int,
                     sizes: np.ndarray | None = None) -> BatchResult:
    """B solves of `small_trf.trf_bounds` (ftol = xtol = gtol = `tol`) at once. `x0` (B, n)
    strictly inside the bounds (lb, ub: (n,) shared, or (B, n) one pair per problem), `f0` (B, m)
    the residuals there; `fun(X, rows)` and `jac(X, rows)` give the residuals (k, m) and
    Jacobians (k, m, n) of problems `rows` at X. `sizes` (B,): each problem's own number of
    residuals where problems of different sizes share the batch, padded to m with residuals
    and Jacobian rows that are 0 (they change no sum; the size enters the rank test)."""
    B, n = x0.shape
    m = f0.shape[1]
    lb, ub = np.broadcast_to(lb, (B, n)), np.broadcast_to(ub, (B, n))
    m_of = np.full(B, m, dtype=np.int64) if sizes is None else np.asarray(sizes, dtype=np.int64)
    x, f = x0.copy(), f0.copy()
    J = jac(x, np.arange(B))
    nfev = np.ones(B, dtype=np.int64)
    cost = 0.5 * _rowdot(f, f)
    g = np.einsum("bmn,bm->bn", J, f)
    scale, scale_inv = _jac_scale(J)
    v, dv = _cl_scaling(x, g, lb, ub)
    v = np.where(dv != 0, v * scale_inv, v)
    Delta = np.sqrt(_rowdot(x0 * scale_inv / v ** 0.5, x0 * scale_inv / v ** 0.5))
    Delta = np.where(Delta == 0, 1.0, Delta)
    alpha = np.zeros(B)
    status = np.full(B, _RUNNING, dtype=np.int64)
    done = np.zeros(B, dtype=bool)
    at_top = np.ones(B, dtype=bool)           # at the top of the outer loop: a new SVD is due
    reduction = np.full(B, -1.0)
    # the current outer iteration's quantities, per problem
    d = np.zeros((B, n))
    diag_h = np.zeros((B, n))
    g_h = np.zeros((B, n))
    J_h = np.zeros((B, m, n))
    s = np.ones((B, n))
    V = np.zeros((B, n, n))
    uf = np.zeros((B, n))
    theta = np.zeros(B)
    errors: list[str | None] = [None] * B
    while True:
        top = np.flatnonzero(at_top & ~done)
        if len(top):
            v, dv = _cl_scaling(x[top], g[top], lb[top], ub[top])
            g_norm = np.abs(g[top] * v).max(axis=1)
            status[top[g_norm < tol]] = 1
            stop = (status[top] != _RUNNING) | (nfev[top] == max_nfev)
            done[top[stop]] = True
            at_top[top] = False
            keep = ~stop
            go, v, dv, g_norm = top[keep], v[keep], dv[keep], g_norm[keep]
            if len(go):
                v = np.where(dv != 0, v * scale_inv[go], v)
                d[go] = v ** 0.5 * scale[go]
                diag_h[go] = g[go] * dv * scale[go]
                g_h[go] = d[go] * g[go]
                J_h[go] = J[go] * d[go][:, None, :]
                augmented = np.zeros((len(go), m + n, n))
                augmented[:, :m] = J_h[go]
                augmented[:, m + np.arange(n), np.arange(n)] = diag_h[go] ** 0.5
                U, s_go, Vt, failed = _svd_rows(augmented)
                if any(failed):
                    good = np.ones(len(go), dtype=bool)
                    for i, error in enumerate(failed):
                        if error:              # the single solve raises here: this problem ends
                            errors[go[i]], done[go[i]], good[i] = str(error), True, False
                    go, U, s_go, Vt, g_norm = go[good], U[good], s_go[good], Vt[good], g_norm[good]
                s[go] = s_go
                V[go] = np.swapaxes(Vt, 1, 2)
                uf[go] = np.einsum("bmn,bm->bn", U[:, :m], f[go])
                theta[go] = np.maximum(0.995, 1 - g_norm)
                reduction[go] = -1.0
        trial = np.flatnonzero(~done & ~at_top)
        if not len(trial):
            if done.all():
                break
            continue
        p_h, alpha[trial] = _trust_region_steps(m_of[trial], uf[trial], s[trial], V[trial], Delta[trial], alpha[trial])
        step, step_h, predicted = _select_steps(x[trial], J_h[trial], diag_h[trial], g_h[trial], d[trial] * p_h,
                                                p_h, d[trial], Delta[trial], lb[trial], ub[trial], theta[trial])
        x_new = _nudged_inside(x[trial] + step, lb[trial], ub[trial])
        f_new = fun(x_new, trial)
        nfev[trial] += 1
        step_h_norm = np.sqrt(_rowdot(step_h, step_h))
        finite = np.isfinite(f_new).all(axis=1)
        cost_new = 0.5 * _rowdot(f_new, f_new)
        actual = np.where(finite, cost[trial] - cost_new, reduction[trial])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(predicted > 0, actual / predicted,
                             np.where((predicted == 0) & (actual == 0), 1.0, 0.0))
        Delta_new = np.where(ratio < 0.25, 0.25 * step_h_norm,
                             np.where((ratio > 0.75) & (step_h_norm > 0.95 * Delta[trial]),
                                      2.0 * Delta[trial], Delta[trial]))
        ftol_ok = (actual < tol * cost[trial]) & (ratio > 0.25)
        step_norm = np.sqrt(_rowdot(step, step))
        xtol_ok = step_norm < tol * (tol + np.sqrt(_rowdot(x[trial], x[trial])))
        term = np.where(ftol_ok & xtol_ok, 4, np.where(ftol_ok, 2, np.where(xtol_ok, 3, _RUNNING)))
        term = np.where(finite, term, _RUNNING)
        stopped = term != _RUNNING
        status[trial[stopped]] = term[stopped]
        # a non-finite trial shrinks the region and tries again; a finite one that did not stop
        # the solve moves the region and the Levenberg-Marquardt parameter
        moved = finite & ~stopped
        with np.errstate(divide="ignore", invalid="ignore"):
            alpha[trial] = np.where(moved, alpha[trial] * Delta[trial] / Delta_new, alpha[trial])
        Delta[trial] = np.where(moved, Delta_new, np.where(finite, Delta[trial], 0.25 * step_h_norm))
        reduction[trial] = actual
        leave = stopped | (actual > 0) | (nfev[trial] >= max_nfev)
        accept = leave & (actual > 0)
        if accept.any():
            rows = trial[accept]
            x[rows], f[rows], cost[rows] = x_new[accept], f_new[accept], cost_new[accept]
            J[rows] = jac(x[rows], rows)
            g[rows] = np.einsum("bmn,bm->bn", J[rows], f[rows])
            scale[rows], scale_inv[rows] = _jac_scale(J[rows], scale_inv[rows])
        at_top[trial[leave]] = True
    status = np.where(status == _RUNNING, 0, status)
    status[[i for i, e in enumerate(errors) if e is not None]] = -1
    return BatchResult(x=x, cost=cost, status=status, nfev=nfev, errors=errors)


def _svd_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str | bool]]:
    """The thin SVD of every matrix of `a` (k, r, n), and per matrix False or the error the
    single solve's SVD raises for it (a matrix that is not finite, or one LAPACK cannot
    decompose), so that one bad problem ends itself, not the batch."""
    k, r, n = a.shape
    failed: list[str | bool] = [False] * k
    finite = np.isfinite(a).all(axis=(1, 2))
    if finite.all():                        # the usual case: one call, no copies
        try:
            U, s, Vt = np.linalg.svd(a, full_matrices=False)
            return U, s, Vt, failed
        except np.linalg.LinAlgError:
            pass                            # find the matrix that fails, one at a time below
    for i in np.flatnonzero(~finite):
        failed[i] = "array must not contain infs or NaNs"
    U, s, Vt = np.zeros((k, r, n)), np.ones((k, n)), np.zeros((k, n, n))
    rows = np.flatnonzero(finite)
    try:
        U[rows], s[rows], Vt[rows] = np.linalg.svd(a[rows], full_matrices=False)
    except np.linalg.LinAlgError:
        for i in rows:
            try:
                U[i], s[i], Vt[i] = np.linalg.svd(a[i], full_matrices=False)
            except np.linalg.LinAlgError:
                failed[i] = "SVD did not converge"
    return U, s, Vt, failed


def _select_steps(x: np.ndarray, J_h: np.ndarray, diag_h: np.ndarray, g_h: np.ndarray, p: np.ndarray,
                  p_h: np.ndarray, d: np.ndarray, Delta: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                  theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """scipy's `select_step` per row: the trust-region step where it stays inside the bounds,
    otherwise (rarely) the scalar loop's choice among the reflected and the gradient steps."""
    x_p = x + p
    inside = ((x_p >= lb) & (x_p <= ub)).all(axis=1)
    step, step_h = p.copy(), p_h.copy()
    predicted = -_quadratic(J_h, g_h, p_h, diag_h)
    for i in np.flatnonzero(~inside):
        step[i], step_h[i], predicted[i] = _select_step(x[i], J_h[i], diag_h[i], g_h[i], p[i].copy(),
                                                        p_h[i].copy(), d[i], float(Delta[i]), lb[i], ub[i],
                                                        float(theta[i]))
    return step, step_h, predicted
