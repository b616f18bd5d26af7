"""scipy's bounded trust-region-reflective solve, step for step, for the sigmoid's 4 parameters.

`least_squares(method="trf", tr_solver="exact", x_scale="jac")` with bounds runs scipy's
`trf_bounds` (scipy/optimize/_lsq/trf.py, BSD-3-Clause, Copyright (c) 2001-2002 Enthought,
Inc. and 2003 SciPy Developers). The sigmoid fits solve thousands of problems of 4 parameters
and a few dozen rows, where that loop's time goes to per-call bookkeeping rather than to
arithmetic: `numpy.linalg.norm`'s argument handling on 4-vectors, `scipy.linalg.svd`'s batching
and workspace query around one LAPACK call, generic helpers that re-check what this problem never
has (a loss function, sparse Jacobians, a callback, verbose output).

`trf_bounds` below is that loop with the same operations in the same order on the same arrays
(so the same floating-point results, to the bit): the Euclidean norm written as numpy computes it
(`sqrt(x·x)`), the ∞-norm as `max|x|`, the SVD as the same LAPACK routine (`?gesdd`) with the same
workspace size, and only the branches this problem takes. The step that leaves the bounds does
its elementwise arithmetic on Python floats (`_reflected_step_floats`: the same IEEE operations on
4 values, where numpy's per-call cost was most of a fit's reflected steps), its dot products on
arrays as before. `tests/test_parametric_solver.py`
compares it, solve by solve, with `least_squares` and with scipy's own core; where a scipy
changes its algorithm, those comparisons fail rather than a fit drifting.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable

import numpy as np
from numpy.linalg import LinAlgError
from scipy.linalg.lapack import _compute_lwork, get_lapack_funcs
from scipy.optimize import OptimizeResult
from scipy.optimize._lsq.common import (build_quadratic_1d, check_termination, find_active_constraints,
                                        intersect_trust_region, minimize_quadratic_1d, step_size_to_bound,
                                        update_tr_radius)

_EPS = np.finfo(float).eps
_GESDD, _GESDD_LWORK = get_lapack_funcs(("gesdd", "gesdd_lwork"), (np.zeros((2, 2)),), ilp64="preferred")


def _norm(x: np.ndarray) -> np.floating:
    """`numpy.linalg.norm(x)` of a 1-D float array: sqrt of x·x, as numpy computes it (a numpy
    float, so a division by a zero norm gives inf as in scipy, not ZeroDivisionError)."""
    return np.sqrt(x.dot(x))


@lru_cache(maxsize=64)
def _lwork(m: int, n: int) -> int:
    return _compute_lwork(_GESDD_LWORK, m, n, compute_uv=True, full_matrices=False)


def _svd(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`scipy.linalg.svd(a, full_matrices=False)` of a float64 matrix: its finiteness check, the
    same LAPACK call with the same workspace, its errors."""
    if not np.isfinite(a).all():
        raise ValueError("array must not contain infs or NaNs")
    u, s, vt, info = _GESDD(a, compute_uv=True, lwork=_lwork(*a.shape), full_matrices=False, overwrite_a=False)
    if info > 0:
        raise LinAlgError("SVD did not converge")
    if info < 0:
        raise ValueError("A has a NaN entry" if info == -4 else f"illegal value in {-info}th argument of internal gesdd")
    return u, s, vt


def _cl_scaling_vector(x: np.ndarray, g: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Coleman-Li scaling vector and its derivative (scipy's `CL_scaling_vector`)."""
    v = np.ones(x.shape)
    dv = np.zeros(x.shape)
    mask = (g < 0) & np.isfinite(ub)
    v[mask] = ub[mask] - x[mask]
    dv[mask] = -1
    mask = (g > 0) & np.isfinite(lb)
    v[mask] = x[mask] - lb[mask]
    dv[mask] = 1
    return v, dv


def _jac_scale(J: np.ndarray, scale_inv_old: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """scipy's `compute_jac_scale` of a dense Jacobian."""
    scale_inv = (J ** 2).sum(axis=0) ** 0.5
    if scale_inv_old is None:
        scale_inv[scale_inv == 0] = 1
    else:
        scale_inv = np.maximum(scale_inv, scale_inv_old)
    return 1 / scale_inv, scale_inv


def _quadratic(J: np.ndarray, g: np.ndarray, s: np.ndarray, diag: np.ndarray) -> float:
    """scipy's `evaluate_quadratic` of one step: 0.5 s'(J'J + diag)s + g's."""
    Js = J.dot(s)
    q = np.dot(Js, Js)
    q += np.dot(s * diag, s)
    return 0.5 * q + np.dot(s, g)


def _solve_lsq_trust_region(n: int, m: int, uf: np.ndarray, s: np.ndarray, V: np.ndarray, Delta: float,
                            initial_alpha: float, rtol: float = 0.01, max_iter: int = 10) -> tuple[np.ndarray, float, int]:
    """scipy's `solve_lsq_trust_region` (Moré's method on one SVD)."""
    def phi_and_derivative(alpha: float) -> tuple[float, float]:
        denom = s ** 2 + alpha
        p_norm = _norm(suf / denom)
        return p_norm - Delta, -(suf ** 2 / denom ** 3).sum() / p_norm

    suf = s * uf
    if m >= n:
        full_rank = s[-1] > _EPS * m * s[0]
    else:
        full_rank = False
    if full_rank:
        p = -V.dot(uf / s)
        if _norm(p) <= Delta:
            return p, 0.0, 0
    alpha_upper = _norm(suf) / Delta
    if full_rank:
        phi, phi_prime = phi_and_derivative(0.0)
        alpha_lower = -phi / phi_prime
    else:
        alpha_lower = 0.0
    if initial_alpha is None or not full_rank and initial_alpha == 0:
        alpha = max(0.001 * alpha_upper, (alpha_lower * alpha_upper) ** 0.5)
    else:
        alpha = initial_alpha
    for it in range(max_iter):
        if alpha < alpha_lower or alpha > alpha_upper:
            alpha = max(0.001 * alpha_upper, (alpha_lower * alpha_upper) ** 0.5)
        phi, phi_prime = phi_and_derivative(alpha)
        if phi < 0:
            alpha_upper = alpha
        ratio = phi / phi_prime
        alpha_lower = max(alpha_lower, alpha - ratio)
        alpha -= (phi + Delta) * ratio / Delta
        if np.abs(phi) < rtol * Delta:
            break
    p = -V.dot(suf / (s ** 2 + alpha))
    p *= Delta / _norm(p)
    return p, alpha, it + 1


def _select_step(x: np.ndarray, J_h: np.ndarray, diag_h: np.ndarray, g_h: np.ndarray, p: np.ndarray,
                 p_h: np.ndarray, d: np.ndarray, Delta: float, lb: np.ndarray, ub: np.ndarray,
                 theta: float) -> tuple[np.ndarray, np.ndarray, float]:
    """scipy's `select_step` of the trust-region-reflective method."""
    x_p = x + p
    if ((x_p >= lb) & (x_p <= ub)).all():
        return p, p_h, -_quadratic(J_h, g_h, p_h, diag_h)
    chosen = _reflected_step_floats(x, J_h, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta)
    if chosen is not None:
        return chosen
    return _reflected_step(x, J_h, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta)


def _reflection_stride_bounds(p_stride: Any, to_bound: Any, to_tr: Any, theta: float) -> tuple[Any, Any]:
    """The segment of the reflected step's stride scipy's `select_step` searches (empty, lower
    above upper, when the reflection cannot move), in the operations and types it is given:
    numpy scalars from the arrays' path, Python floats from the floats' path."""
    r_stride = min(to_bound, to_tr)
    if r_stride > 0:
        return (1 - theta) * p_stride / r_stride, theta * to_bound if r_stride == to_bound else to_tr
    return 0, -1


def _bound_steps(x: list[float], s: list[float], lb: list[float], ub: list[float]) -> tuple[float, list[float]] | None:
    """`step_size_to_bound(x, s, lb, ub)` of finite vectors in Python floats (the same IEEE
    divisions): the least step and every coordinate's step; or None where the arrays' answer
    could differ in the sign of a zero: a pair of quotients that ties, or a least step that is
    0 or not finite."""
    steps = []
    for xi, si, li, ui in zip(x, s, lb, ub):
        if si == 0:
            steps.append(math.inf)
            continue
        low, high = (li - xi) / si, (ui - xi) / si
        if low == high:
            return None
        steps.append(low if low > high else high)
    least = min(steps)
    return (least, steps) if least != 0 and math.isfinite(least) else None


def _least_on_segment(a: np.floating, b: np.floating, lb: float, ub: float,
                      c: np.floating | float = 0) -> tuple[np.floating, np.floating] | None:
    """`minimize_quadratic_1d(a, b, lb, ub, c)` on scalars: the same candidates (the ends, and
    the extremum where it lies between them), each valued by the same operations, the first
    least one taken; None where a value is NaN (numpy's argmin would take the first NaN)."""
    t = [float(lb), float(ub)]
    if a != 0:
        extremum = -0.5 * b / a
        if lb < extremum < ub:
            t.append(float(extremum))
    y = [ti * (a * ti + b) + c for ti in t]
    if any(math.isnan(v) for v in y):
        return None
    best = 0
    for i in range(1, len(y)):
        if y[i] < y[best]:
            best = i
    return np.float64(t[best]), np.float64(y[best])


def _reflected_step_floats(x: np.ndarray, J_h: np.ndarray, diag_h: np.ndarray, g_h: np.ndarray, p: np.ndarray,
                           p_h: np.ndarray, d: np.ndarray, Delta: float, lb: np.ndarray, ub: np.ndarray,
                           theta: float) -> tuple[np.ndarray, np.ndarray, float] | None:
    """`_reflected_step` with its elementwise arithmetic on Python floats: the same IEEE
    operations on the same values, so the same bits, without numpy's per-call cost on
    4-vectors (about 2 µs an operation, most of a reflected step). Every dot product and every
    scipy helper is called on arrays holding the values `_reflected_step` passes it. None (the
    caller takes `_reflected_step`) where an input is not finite or `_bound_steps` declines."""
    X, P, PH, D, L, U = x.tolist(), p.tolist(), p_h.tolist(), d.tolist(), lb.tolist(), ub.tolist()
    G = g_h.tolist()
    if not all(map(math.isfinite, [*X, *P, *PH, *D, *L, *U, *G, Delta, theta])) or not np.isfinite(diag_h).all():
        return None
    found = _bound_steps(X, P, L, U)
    if found is None:
        return None
    p_stride, steps = found
    # the coordinates that reach a bound first are reflected (scipy's `hits`)
    flip = [step == p_stride and si != 0 for step, si in zip(steps, P)]
    r_h = [-v if f else v for v, f in zip(PH, flip)]
    r = [di * v for di, v in zip(D, r_h)]
    P = [v * p_stride for v in P]
    PH = [v * p_stride for v in PH]
    x_on_bound = [xi + pi for xi, pi in zip(X, P)]
    r_h_a, p_h_a = np.array(r_h), np.array(PH)
    _, to_tr = intersect_trust_region(p_h_a, r_h_a, Delta)
    found = _bound_steps(x_on_bound, r, L, U)
    if found is None:
        return None
    to_bound = found[0]
    r_stride_l, r_stride_u = _reflection_stride_bounds(p_stride, to_bound, to_tr, theta)
    if r_stride_l <= r_stride_u:
        a, b, c = build_quadratic_1d(J_h, g_h, r_h_a, s0=p_h_a, diag=diag_h)
        least = _least_on_segment(a, b, r_stride_l, r_stride_u, c=c)
        if least is None:
            return None
        r_stride, r_value = least
        r_h = [v * r_stride + w for v, w in zip(r_h, PH)]
        r = [v * di for v, di in zip(r_h, D)]
    else:
        r_value = np.inf
    P = [v * theta for v in P]
    PH = [v * theta for v in PH]
    p_value = _quadratic(J_h, g_h, np.array(PH), diag_h)
    ag_h = [-v for v in G]
    ag = [di * v for di, v in zip(D, ag_h)]
    ag_h_a = np.array(ag_h)
    to_tr = Delta / _norm(ag_h_a)
    found = _bound_steps(X, ag, L, U)
    if found is None:
        return None
    to_bound = found[0]
    ag_stride = theta * to_bound if to_bound < to_tr else to_tr
    a, b = build_quadratic_1d(J_h, g_h, ag_h_a, diag=diag_h)
    least = _least_on_segment(a, b, 0, ag_stride)
    if least is None:
        return None
    ag_stride, ag_value = least
    if p_value < r_value and p_value < ag_value:
        return np.array(P), np.array(PH), -p_value
    elif r_value < p_value and r_value < ag_value:
        return np.array(r), np.array(r_h), -r_value
    else:
        return np.array([v * ag_stride for v in ag]), np.array([v * ag_stride for v in ag_h]), -ag_value


def _reflected_step(x: np.ndarray, J_h: np.ndarray, diag_h: np.ndarray, g_h: np.ndarray, p: np.ndarray,
                    p_h: np.ndarray, d: np.ndarray, Delta: float, lb: np.ndarray, ub: np.ndarray,
                    theta: float) -> tuple[np.ndarray, np.ndarray, float]:
    """scipy's `select_step` where the trust-region step leaves the bounds: the best of that step
    cut at the bound, its reflection and the gradient step."""
    p_stride, hits = step_size_to_bound(x, p, lb, ub)
    r_h = np.copy(p_h)
    r_h[hits.astype(bool)] *= -1
    r = d * r_h
    p *= p_stride
    p_h *= p_stride
    x_on_bound = x + p
    _, to_tr = intersect_trust_region(p_h, r_h, Delta)
    to_bound, _ = step_size_to_bound(x_on_bound, r, lb, ub)
    r_stride_l, r_stride_u = _reflection_stride_bounds(p_stride, to_bound, to_tr, theta)
    if r_stride_l <= r_stride_u:
        a, b, c = build_quadratic_1d(J_h, g_h, r_h, s0=p_h, diag=diag_h)
        r_stride, r_value = minimize_quadratic_1d(a, b, r_stride_l, r_stride_u, c=c)
        r_h *= r_stride
        r_h += p_h
        r = r_h * d
    else:
        r_value = np.inf
    p *= theta
    p_h *= theta
    p_value = _quadratic(J_h, g_h, p_h, diag_h)
    ag_h = -g_h
    ag = d * ag_h
    to_tr = Delta / _norm(ag_h)
    to_bound, _ = step_size_to_bound(x, ag, lb, ub)
    ag_stride = theta * to_bound if to_bound < to_tr else to_tr
    a, b = build_quadratic_1d(J_h, g_h, ag_h, diag=diag_h)
    ag_stride, ag_value = minimize_quadratic_1d(a, b, 0, ag_stride)
    ag_h *= ag_stride
    ag *= ag_stride
    if p_value < r_value and p_value < ag_value:
        return p, p_h, -p_value
    elif r_value < p_value and r_value < ag_value:
        return r, r_h, -r_value
    else:
        return ag, ag_h, -ag_value


def _nudged_inside(x: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> np.ndarray:
    """scipy's `make_strictly_feasible(x, lb, ub, rstep=0)`: a coordinate on or past a bound is
    moved to the next float inside it."""
    upper_mask = x >= ub                    # as find_active_constraints(rtol=0) marks them:
    lower_mask = (x <= lb) & ~upper_mask    # the upper test is applied last
    if not (upper_mask.any() or lower_mask.any()):
        return x                            # strictly inside already: scipy's copy, unchanged
    x_new = x.copy()
    x_new[lower_mask] = np.nextafter(lb[lower_mask], ub[lower_mask])
    x_new[upper_mask] = np.nextafter(ub[upper_mask], lb[upper_mask])
    tight_bounds = (x_new < lb) | (x_new > ub)
    x_new[tight_bounds] = 0.5 * (lb[tight_bounds] + ub[tight_bounds])
    return x_new


def trf_bounds(fun: Callable[[np.ndarray], np.ndarray], jac: Callable[[np.ndarray], np.ndarray], x0: np.ndarray,
               f0: np.ndarray, J0: np.ndarray, lb: np.ndarray, ub: np.ndarray, ftol: float, xtol: float,
               gtol: float, max_nfev: int) -> Any:
    """scipy's `trf_bounds` with tr_solver "exact", x_scale "jac", no loss function, no callback:
    `x0` strictly inside the bounds, `f0` and `J0` the residuals and Jacobian there. Returns
    scipy's OptimizeResult fields (x, cost, fun, jac, grad, optimality, active_mask, nfev, njev,
    status)."""
    x = x0.copy()
    f = f0
    f_true = f.copy()
    nfev = 1
    J = J0
    njev = 1
    m, n = J.shape
    cost = 0.5 * np.dot(f, f)
    g = J.T.dot(f)
    scale, scale_inv = _jac_scale(J)
    v, dv = _cl_scaling_vector(x, g, lb, ub)
    v[dv != 0] *= scale_inv[dv != 0]
    Delta = _norm(x0 * scale_inv / v ** 0.5)
    if Delta == 0:
        Delta = 1.0
    g_norm = np.abs(g * v).max()
    f_augmented = np.zeros(m + n)
    J_augmented = np.empty((m + n, n))
    diagonal = (np.arange(m, m + n), np.arange(n))   # the rows under J: diag(diag_h ** 0.5)
    alpha = 0.0   # the Levenberg-Marquardt parameter
    termination_status = None
    while True:
        v, dv = _cl_scaling_vector(x, g, lb, ub)
        g_norm = np.abs(g * v).max()
        if g_norm < gtol:
            termination_status = 1
        if termination_status is not None or nfev == max_nfev:
            break
        moving = dv != 0
        v[moving] *= scale_inv[moving]
        d = v ** 0.5 * scale
        diag_h = g * dv * scale
        g_h = d * g
        f_augmented[:m] = f
        J_augmented[:m] = J * d
        J_h = J_augmented[:m]
        J_augmented[m:] = 0.0
        J_augmented[diagonal] = diag_h ** 0.5
        U, s, Vt = _svd(J_augmented)
        V = Vt.T
        uf = U.T.dot(f_augmented)
        theta = max(0.995, 1 - g_norm)
        actual_reduction = -1
        while actual_reduction <= 0 and nfev < max_nfev:
            p_h, alpha, _ = _solve_lsq_trust_region(n, m, uf, s, V, Delta, initial_alpha=alpha)
            p = d * p_h
            step, step_h, predicted_reduction = _select_step(x, J_h, diag_h, g_h, p, p_h, d, Delta, lb, ub, theta)
            x_new = _nudged_inside(x + step, lb, ub)
            f_new = fun(x_new)
            nfev += 1
            step_h_norm = _norm(step_h)
            if not np.isfinite(f_new).all():
                Delta = 0.25 * step_h_norm
                continue
            cost_new = 0.5 * np.dot(f_new, f_new)
            actual_reduction = cost - cost_new
            Delta_new, ratio = update_tr_radius(Delta, actual_reduction, predicted_reduction, step_h_norm,
                                                step_h_norm > 0.95 * Delta)
            termination_status = check_termination(actual_reduction, cost, _norm(step), _norm(x), ratio,
                                                    ftol, xtol)
            if termination_status is not None:
                break
            alpha *= Delta / Delta_new
            Delta = Delta_new
        if actual_reduction > 0:
            x = x_new
            f = f_new
            f_true = f.copy()
            cost = cost_new
            J = jac(x)
            njev += 1
            g = J.T.dot(f)
            scale, scale_inv = _jac_scale(J, scale_inv)
        else:
            actual_reduction = 0
    if termination_status is None:
        termination_status = 0
    return OptimizeResult(x=x, cost=cost, fun=f_true, jac=J, grad=g, optimality=g_norm,
                          active_mask=find_active_constraints(x, lb, ub, rtol=xtol), nfev=nfev, njev=njev,
                          status=termination_status)
