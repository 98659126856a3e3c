"""Compiled decisions of the class set policy (numba): :class:`JitSetScorer`.

The numpy path (:class:`train.fast.NumpySetScorer`) costs about 90 small numpy calls per step,
whose fixed per-call cost (not arithmetic) dominates: about 0.8-1.2 ms per step whatever the
number of pending requests. Here the same computation - class keys, the classes, class means,
the network with its load-feedback pass and the safety knobs, and the systematic split - runs
compiled. :meth:`JitSetScorer.decide` makes a whole decision in one call with few arguments
(the weights packed in one buffer; the uniforms drawn ahead by
:class:`train.fast.UniformStream`; only the slots that hold requests read, using the env's count
of them), because on a machine that has just run an env step or a solver, the fixed costs of a
call - the dispatcher, cold code - weigh as much as the arithmetic: about 25 us per compiled call
and 5-60 us per numpy call, against 0.1-0.2 ms of work. For the same reason the hot loops avoid
data-dependent branches (a real observation defeats the branch predictor that a benchmark
repeating one input trains) and signed computed indices (numba's wrap-around check keeps a
loop from vectorising), the softmaxes' exponentials come from a polynomial (:func:`_exp`, whose
loops vectorise, unlike calls into libm), and the call fills an action array the caller
allocates and returns two integers.
:meth:`JitSetScorer.class_logits` and :meth:`JitSetScorer.systematic` do the same in two steps
for any rows (they sort the rows by class); the policy uses them when the requests are not in
slots 0..n-1, the masks differ between requests, or the mode is not ``systematic``.

Same results as the numpy path in float64 (``NumpySetScorer(net, dtype=numpy.float64)``): the
same classes (keys computed with the same float32 / float64 operations, classes in key order,
members in row order like numpy's stable sort), logits equal up to the order of floating-point
sums (~1e-12; the numpy path's matrix products use BLAS) and the last bit of an exponential (at
most 1 ulp), and the same systematic split given the same uniform draws (checked on whole
episodes). The two compiled paths give the same logits to the bit.
``tests/test_train_fast.py`` checks classes, logits and actions.

numba is optional (``pip install -e '.[fast]'``, included in ``[train]``);
:func:`available` says whether it can be used. Functions are compiled on first use (a few
seconds; cached on disk by numba) - :class:`JitSetScorer` compiles them when it is built, so
that no decision pays for it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .fast import NumpySetScorer, UniformStream
from .set_policy import _USED_BINS, MASKED_LOGIT

__all__ = ["JitSetScorer", "available"]

_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)

try:  # pragma: no cover - exercised when numba is installed (CI installs it)
    import numba as _nb

    _njit = _nb.njit(cache=True, nogil=True)
except ImportError:  # pragma: no cover - the numpy path is used instead
    _nb = None
    _njit = None


def available() -> bool:
    """Whether numba is installed (the compiled path can be used)."""
    return _nb is not None


def _affine(x: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x @ W + b (rows of x). Each output is summed over t in ascending order from 0.0, the
    loops ordered so that the innermost one runs over independent outputs (it vectorises).
    Zero inputs (units cut by a ReLU) are skipped - adding +-0.0 changes no bit - through a list
    of the nonzero ones built without branches (a branch per input mispredicts half the time)."""
    n, k = x.shape
    m = W.shape[1]
    out = np.zeros((n, m))
    nonzero = np.empty(k, dtype=np.int64)
    for i in range(n):
        cnt = 0
        for t in range(k):
            nonzero[cnt] = t
            cnt += x[i, t] != 0.0
        for q in range(cnt):
            t = nonzero[q]
            xv = x[i, t]
            for j in range(m):
                out[i, j] += xv * W[t, j]
        for j in range(m):
            out[i, j] += b[j]
    return out


def _relu_affine(x: np.ndarray, W: np.ndarray, b: np.ndarray) -> np.ndarray:
    """max(x @ W + b, 0) (as :func:`_affine`)."""
    out = _affine(x, W, b)
    n, m = out.shape
    for i in range(n):
        for j in range(m):
            if out[i, j] < 0.0:  # (NaN propagates, as with np.maximum)
                out[i, j] = 0.0
    return out


def _count_le(edges: np.ndarray, x: float) -> int:
    """Number of ``edges`` <= x (``numpy.searchsorted(edges, x, "right")``) for edges
    ``w, 2w, 3w, ...`` (w = edges[0] > 0, the used-time bins): a guess from x / w, then corrected
    against the edges themselves, so rounding cannot move a value across an edge."""
    m = edges.shape[0]
    if not x == x:  # NaN sorts after every edge
        return m
    g = x / edges[0]
    if g <= 0.0:
        k = 0
    elif g >= m:
        k = m
    else:
        k = int(g)
    while k > 0 and edges[k - 1] > x:
        k -= 1
    while k < m and edges[k] <= x:
        k += 1
    return k


def _row_mean(x: np.ndarray) -> np.ndarray:
    """The mean of the rows of ``x`` as a (1, m) array (rows added in order, as numpy's
    ``x.sum(axis=0) / n``)."""
    n, m = x.shape
    out = np.zeros((1, m))
    for i in range(n):
        for j in range(m):
            out[0, j] += x[i, j]
    for j in range(m):
        out[0, j] /= n
    return out


#: Constants of :func:`_exp`: log2(e), ln 2 in two parts (fdlibm's: the high part has trailing
#: zero bits, so k x _LN2_HI is exact for |k| < 2^11), 1.5 x 2^52 (adding it rounds to an integer
#: held in the low bits), and the Taylor coefficients 1 / k! for k = 2 .. 13.
_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SHIFT = 6755399441055744.0
_SHIFT_BITS = 0x4338000000000000
(_E2, _E3, _E4, _E5, _E6, _E7, _E8, _E9, _E10, _E11, _E12, _E13) = (1.0 / math.factorial(k) for k in range(2, 14))


def _f64_bits(x: float) -> int:
    """The bits of the float64 ``x`` as an int64 (compiled: a bitcast, which vectorises)."""
    return int(np.array(x, dtype=np.float64).view(np.int64))


def _bits_f64(b: int) -> float:
    """The float64 whose bits are the int64 ``b`` (compiled: a bitcast)."""
    return float(np.array(b & 0xFFFF_FFFF_FFFF_FFFF, dtype=np.uint64).view(np.float64))


def _exp(x: float) -> float:
    """exp(x) for x <= 709 (a softmax's x - max <= 0), without a call into libm, so that a loop
    of them vectorises (4 at a time with AVX2: 2-3x faster than ``np.exp`` per value): x = k ln 2
    + r, |r| <= ln(2) / 2, exp(r) by its Taylor polynomial of degree 13 (truncation error < 5e-18)
    and 2^k from its exponent bits. At most 1 ulp from the correctly rounded value (92% equal to
    numpy's ``exp`` on 3 million draws, the rest 1 ulp off); 0 below -708 (where exp is below
    2.3e-308, which adds nothing to a softmax's sum, whose largest term is 1); NaN stays NaN."""
    kd = x * _LOG2E + _SHIFT
    ki = _f64_bits(kd) - _SHIFT_BITS
    kd = kd - _SHIFT
    r = x - kd * _LN2_HI
    r = r - kd * _LN2_LO
    p = _E13 * r + _E12
    p = p * r + _E11
    p = p * r + _E10
    p = p * r + _E9
    p = p * r + _E8
    p = p * r + _E7
    p = p * r + _E6
    p = p * r + _E5
    p = p * r + _E4
    p = p * r + _E3
    p = p * r + _E2
    p = p * r + 1.0
    p = p * r + 1.0
    res = p * _bits_f64((ki + 1023) << 52)
    return 0.0 if x < -708.0 else res


def _softmax_row(logits: np.ndarray, c: int, up: np.ndarray, zc: np.ndarray) -> float:
    """exp(logit - row max) of class ``c`` into ``zc`` (D + 1: the datacenters, those that are
    down at MASKED_LOGIT, then defer); returns their sum (as the numpy path's masked softmax;
    the exponentials by :func:`_exp`, in a loop of their own so that it vectorises)."""
    D = up.shape[0]
    mx = logits[c, D]
    for d in range(D):  # (selects, not branches)
        v = logits[c, d] if up[d] else MASKED_LOGIT
        mx = v if v > mx else mx
    for d in range(D):
        v = logits[c, d] if up[d] else MASKED_LOGIT
        zc[d] = _exp(v - mx)
    zc[D] = _exp(logits[c, D] - mx)
    tot = 0.0
    for d in range(D + 1):
        tot += zc[d]
    return tot


def _np_sum(a: np.ndarray) -> float:
    """``numpy.sum`` of a short contiguous float64 array, with numpy's own summation order
    (pairwise: eight partial sums for 8..128 values, sequential below 8), so the value is the
    same to the last bit (checked against numpy in the tests)."""
    n = a.shape[0]
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[i]
        return res
    if n > 128:  # numpy splits longer arrays recursively (not needed here: one entry per datacenter)
        half = (n // 2) - ((n // 2) % 8)
        return _np_sum(a[:half]) + _np_sum(a[half:])
    r0, r1, r2, r3, r4, r5, r6, r7 = a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]
    i = 8
    stop = n - (n % 8)
    while i < stop:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[i]
        i += 1
    return res


def _mean_prefill32(dc32: np.ndarray, c_up: int, c_prefill: int) -> np.float32:
    """The mean prefill time per token over the datacenters that are up (float32; summed as
    numpy sums, as NumpySetScorer.group)."""
    D = dc32.shape[0]
    pre_up = np.empty(D)
    m_up = 0
    for d in range(D):
        if dc32[d, c_up] > 0.5:
            pre_up[m_up] = np.float64(dc32[d, c_prefill])
            m_up += 1
    pref = _np_sum(pre_up[:m_up]) / max(m_up, 1)
    return np.float32(pref)


def _class_keys(rows: np.ndarray, n: int, icol: np.ndarray, origin_key: np.ndarray, out_edges: np.ndarray,
                used_edges: np.ndarray, pref32: np.float32, n_keys: int) -> np.ndarray:
    """Class keys (n,) of slot rows 0..n-1 (as NumpySetScorer.group: float32 products, float64
    comparisons), one part per loop (short loops that the compiler keeps tight). The output bin
    is a count of the edges <= the prediction, without branches (a binary search's branches
    mispredict on most rows of a real observation); columns are indexed unsigned (a signed index
    gets a wrap-around check per access). ``origin_key``: float32 values (any float array)."""
    s_origin, s_prompt, s_pred, s_waited = np.uint64(icol[0]), np.uint64(icol[1]), np.uint64(icol[2]), np.uint64(icol[3])
    m = out_edges.shape[0]
    key = np.empty(n, dtype=np.int64)
    for i in range(n):
        o = np.float32(0.0)
        for r in range(origin_key.shape[0]):
            o += rows[i, s_origin + np.uint64(r)] * np.float32(origin_key[r])
        key[i] = np.int64(o)
    for i in range(n):  # (numpy.searchsorted(out_edges, x, "right"); NaN sorts after every edge)
        x = np.float64(rows[i, s_pred])
        k = 0
        for e in range(m):
            k += out_edges[e] <= x
        key[i] += (k if x == x else m) * _USED_BINS
    for i in range(n):
        used = rows[i, s_prompt] * pref32
        used = used + rows[i, s_waited]
        key[i] += _count_le(used_edges, np.float64(used))
    for i in range(n):  # (a malformed origin one-hot could give a key out of range: keep it in the table)
        key[i] = min(max(key[i], 0), n_keys - 1)
    return key


def _class_means(rows: np.ndarray, row_class: np.ndarray, counts: np.ndarray, icol: np.ndarray,
                 D: int) -> np.ndarray:
    """Mean rows (C, 3 + D: prompt, predicted output, waited, network delay to each datacenter)
    of the classes of rows 0..n-1 (n = len(row_class), the class of each row; ``counts``: class
    sizes), in float64, each class summed over its members in row order (a stable sort's order,
    as np.add.reduceat on the sorted rows). Unsigned indices: numba wraps a negative signed
    index, a check per access that keeps the datacenter loop from vectorising (2x slower)."""
    C = counts.shape[0]
    F = 3 + D
    crow = np.zeros((C, F))
    u_prompt, u_pred, u_waited, u_net = np.uint64(icol[1]), np.uint64(icol[2]), np.uint64(icol[3]), np.uint64(icol[4])
    for i in range(row_class.shape[0]):
        c = np.uint64(row_class[i])
        crow[c, 0] += np.float64(rows[i, u_prompt])
        crow[c, 1] += np.float64(rows[i, u_pred])
        crow[c, 2] += np.float64(rows[i, u_waited])
        for d in range(D):
            crow[c, np.uint64(3 + d)] += np.float64(rows[i, u_net + np.uint64(d)])
    for c in range(C):
        inv_n = np.float64(counts[c])
        for f in range(F):
            crow[c, f] /= inv_n
    return crow


def _class_logits(rows: np.ndarray, dc32: np.ndarray, gl: np.ndarray,
                  icol: np.ndarray, out_edges: np.ndarray, used_edges: np.ndarray, origin_key: np.ndarray,
                  n_out: int, n_keys: int, inv_engines: np.ndarray, n_fmean: float,
                  W_e1: np.ndarray, b_e1: np.ndarray, W_e2: np.ndarray, b_e2: np.ndarray,
                  W_c_own: np.ndarray, W_c_ctx: np.ndarray, b_c: np.ndarray,
                  W_s1: np.ndarray, b_s1: np.ndarray, M_sd: np.ndarray, c_sd: np.ndarray,
                  W_pd: np.ndarray, b_pd: np.ndarray, W_pp: np.ndarray, w_out: np.ndarray, b_out: float,
                  W_d_c: np.ndarray, b_d1: np.ndarray, w_d2: np.ndarray, b_d2: float,
                  load_feedback: int, W_f_e: np.ndarray, W_f_l: np.ndarray, b_f1: np.ndarray, w_f2: np.ndarray, b_f2: float,
                  demand: bool, headroom_penalty: float, headroom_margin: float, load_price: float):
    """(logits (C, D + 1), order (n,), starts (C,), counts (C,)): NumpySetScorer.class_logits
    in float64, for the valid slot rows ``rows`` (n >= 1), the datacenter rows ``dc32`` and the
    globals ``gl``. ``M_sd`` / ``c_sd``: the slot encoder's output layer folded into the pair and
    defer layers (``[W_s2 @ W_ps | W_s2 @ W_d_s]``, ``[b_s2 @ W_ps | b_s2 @ W_d_s]``)."""
    n = rows.shape[0]
    D = dc32.shape[0]
    pref32 = _mean_prefill32(dc32, icol[9], icol[11])
    key = _class_keys(rows, n, icol, origin_key, out_edges, used_edges, pref32, n_keys)
    # ---- counting sort (stable: the order of numpy's stable argsort)
    kmax = 0
    for i in range(n):
        if key[i] > kmax:
            kmax = key[i]
    hist = np.zeros(kmax + 2, dtype=np.int64)
    for i in range(n):
        hist[key[i] + 1] += 1
    C = 0
    for v in range(kmax + 1):
        if hist[v + 1]:
            C += 1
        hist[v + 1] += hist[v]
    order = np.empty(n, dtype=np.int64)
    for i in range(n):
        v = key[i]
        order[hist[v]] = i
        hist[v] += 1
    starts = np.empty(C, dtype=np.int64)
    counts = np.empty(C, dtype=np.int64)
    row_class = np.empty(n, dtype=np.int64)
    c = -1
    prev = -1
    for j in range(n):
        v = key[order[j]]
        if v != prev:
            c += 1
            starts[c] = j
            counts[c] = 0
            prev = v
        counts[c] += 1
        row_class[order[j]] = c
    crow = _class_means(rows, row_class, counts, icol, D)
    logits = _logits_of_classes(
        crow, counts, n, dc32, gl, icol, inv_engines, n_fmean, W_e1, b_e1, W_e2, b_e2, W_c_own, W_c_ctx, b_c,
        W_s1, b_s1, M_sd, c_sd, W_pd, b_pd, W_pp, w_out, b_out, W_d_c, b_d1, w_d2, b_d2,
        load_feedback, W_f_e, W_f_l, b_f1, w_f2, b_f2, demand, headroom_penalty, headroom_margin, load_price)
    return logits, order, starts, counts


def _prefix_classes(slots: np.ndarray, mask: np.ndarray, n_hint: int, s_valid: int, table: np.ndarray,
                    dc32: np.ndarray, icol: np.ndarray, out_edges: np.ndarray, used_edges: np.ndarray,
                    origin_key: np.ndarray, n_keys: int, systematic: bool):
    """The classes of :func:`_class_logits` without the sort, for the usual observation, whose
    valid slots are slots 0..n-1, when the step can be decided by the systematic split
    (``systematic`` and one mask for all n requests): (prefix, n, decidable, class mean rows (C,
    3 + D), class of each row (n,), class sizes (C,)).

    ``prefix`` is False when the valid slots are not 0..n-1, ``decidable`` False when the mask
    rows differ or ``systematic`` is not set; the rest is then empty. ``n_hint`` is the number
    of valid slots when known (the env's ``info["pending"]``, capped at K; -1 if not): if slots
    0..n_hint - 1 are valid and slots n_hint and K - 1 are not, the slots in between are not
    read; otherwise all K are scanned. Classes, their order and the sums of the class means are
    those of :func:`_class_logits` (each class summed over its members in row order, which is
    the stable sort's order), so the logits computed from them are the same to the bit; the rows
    are read in row order, without the sort's gather."""
    K = slots.shape[0]
    D = dc32.shape[0]
    C1 = mask.shape[1]
    e_i = np.empty(0, dtype=np.int64)
    e_f = np.empty((0, 0))
    n = -1
    if 0 <= n_hint <= K and (n_hint == K or not (slots[n_hint, s_valid] > 0.5 or slots[K - 1, s_valid] > 0.5)):
        n = n_hint
        for i in range(n_hint):
            if not slots[i, s_valid] > 0.5:  # (a wrong hint: scan all the slots)
                n = -1
                break
    if n < 0:
        n = 0
        last = -1
        for k in range(K):
            if slots[k, s_valid] > 0.5:
                n += 1
                last = k
        if last != n - 1:
            return False, n, False, e_f, e_i, e_i
    if n == 0:
        return True, 0, systematic, e_f, e_i, e_i
    # mask rows all equal <=> each equals the one before (one flat pass over the n rows' bytes)
    flat = mask.reshape(-1).view(np.uint8)
    after = flat[C1:n * C1]  # (two views, so that the loop indexes from 0: it vectorises)
    before = flat[:(n - 1) * C1]
    diff = np.uint8(0)
    for j in range(after.shape[0]):
        diff |= after[j] ^ before[j]
    if not (systematic and diff == 0):
        return True, n, False, e_f, e_i, e_i
    pref32 = _mean_prefill32(dc32, icol[9], icol[11])
    key = _class_keys(slots, n, icol, origin_key, out_edges, used_edges, pref32, n_keys)
    # ---- classes in key order: the distinct keys, counted in ``table`` (n_keys zeros on entry,
    # restored before returning: only the C entries in use are touched, not all n_keys)
    distinct = np.empty(n, dtype=np.int64)
    C = 0
    for i in range(n):
        k = key[i]
        if table[k] == 0:
            distinct[C] = k
            C += 1
        table[k] += 1
    in_order = np.sort(distinct[:C])
    counts = np.empty(C, dtype=np.int64)
    for c in range(C):
        k = in_order[c]
        counts[c] = table[k]
        table[k] = c
    for i in range(n):
        key[i] = table[key[i]]  # (from here on: the class of each row)
    for c in range(C):
        table[in_order[c]] = 0
    return True, n, True, _class_means(slots, key, counts, icol, D), key, counts


def _slot_layers(crow: np.ndarray, W_s1: np.ndarray, b_s1: np.ndarray, M_sd: np.ndarray, bias: np.ndarray,
                 h: int) -> tuple[np.ndarray, np.ndarray]:
    """The slot encoder of the classes' mean rows ``crow`` (C, 3 + D; its first three columns),
    through the pair and defer layers folded into ``M_sd`` / ``bias`` (2h): (slot part of the pair
    layer (C, h), defer layer after its ReLU (C, h)), as ``_affine(_relu_affine(crow[:, :3], W_s1,
    b_s1), M_sd, bias)`` split and cut, to the bit, in one pass per class without temporaries."""
    C = crow.shape[0]
    H1 = W_s1.shape[1]
    h2 = M_sd.shape[1]
    sp = np.empty((C, h))
    hd = np.empty((C, h))
    h1 = np.empty(H1)
    acc = np.empty(h2)
    for c in range(C):
        for j in range(H1):
            h1[j] = 0.0
        for t in range(3):
            xv = crow[c, t]
            for j in range(H1):
                h1[j] += xv * W_s1[t, j]
        for j in range(H1):
            v = h1[j] + b_s1[j]
            h1[j] = 0.0 if v < 0.0 else v  # (NaN propagates, as in _relu_affine)
        for j in range(h2):
            acc[j] = 0.0
        for t in range(H1):
            hv = h1[t]
            for j in range(h2):
                acc[j] += hv * M_sd[t, j]
        for j in range(h):
            sp[c, j] = acc[j] + bias[j]
        for j in range(h):
            v = acc[h + j] + bias[h + j]
            hd[c, j] = 0.0 if v < 0.0 else v
    return sp, hd


def _logits_of_classes(crow: np.ndarray, counts: np.ndarray, n: int, dc32: np.ndarray, gl: np.ndarray,
                       icol: np.ndarray, inv_engines: np.ndarray, n_fmean: float,
                       W_e1: np.ndarray, b_e1: np.ndarray, W_e2: np.ndarray, b_e2: np.ndarray,
                       W_c_own: np.ndarray, W_c_ctx: np.ndarray, b_c: np.ndarray,
                       W_s1: np.ndarray, b_s1: np.ndarray, M_sd: np.ndarray, c_sd: np.ndarray,
                       W_pd: np.ndarray, b_pd: np.ndarray, W_pp: np.ndarray, w_out: np.ndarray, b_out: float,
                       W_d_c: np.ndarray, b_d1: np.ndarray, w_d2: np.ndarray, b_d2: float,
                       load_feedback: int, W_f_e: np.ndarray, W_f_l: np.ndarray, b_f1: np.ndarray, w_f2: np.ndarray,
                       b_f2: float, demand: bool, headroom_penalty: float, headroom_margin: float,
                       load_price: float) -> np.ndarray:
    """Logits (C, D + 1) of the classes with mean rows ``crow`` (C, 3 + D: prompt, predicted
    output, waited, network delay to each datacenter) and sizes ``counts`` (n requests in all):
    the network, its load-feedback pass and the safety knobs, in float64."""
    C = counts.shape[0]
    D = dc32.shape[0]
    (c_now, c_f1, c_fm0, c_pue, c_up, c_wait, c_prefill) = (icol[5], icol[6], icol[7], icol[8], icol[9], icol[10],
                                                             icol[11])
    n_obs = icol.shape[0] - 14
    sin_t = np.float64(gl[icol[12]])
    cos_t = np.float64(gl[icol[13]])
    # ---- datacenter inputs
    dc = np.empty((D, dc32.shape[1]))
    for d in range(D):
        for f in range(dc32.shape[1]):
            dc[d, f] = np.float64(dc32[d, f])
    up = np.empty(D, dtype=np.bool_)
    n_up = 0
    for d in range(D):
        up[d] = dc[d, c_up] > 0.5
        n_up += up[d]
    eff = np.empty(D)
    eff_min = 1e3 if n_up == 0 else np.inf
    eff_sum = 0.0
    for d in range(D):
        eff[d] = dc[d, c_now] * dc[d, c_pue]
        if up[d]:
            eff_sum += eff[d]
            if eff[d] < eff_min:
                eff_min = eff[d]
    nu = max(float(n_up), 1.0)
    eff_mean = eff_sum / nu
    var = 0.0
    for d in range(D):
        if up[d]:
            dv = eff[d] - eff_mean
            var += dv * dv
    eff_std = np.sqrt(var / nu)
    tot0 = 0.0
    tot1 = 0.0
    for c in range(C):
        tot0 += counts[c] * crow[c, 0]
        tot1 += counts[c] * crow[c, 1]
    n_in = W_e1.shape[0]
    dc_in = np.zeros((D, n_in))
    for d in range(D):
        dc_in[d, 0] = dc[d, c_now]
        dc_in[d, 1] = dc[d, c_f1]
        if n_fmean > 0.0:
            sm = 0.0
            for t in range(int(n_fmean)):
                sm += dc[d, c_fm0 + t]
            dc_in[d, 2] = sm / n_fmean
        else:
            dc_in[d, 2] = dc[d, c_now]
        for t in range(n_obs):
            dc_in[d, 3 + t] = dc[d, icol[14 + t]]
        x = eff[d] - eff_min
        dc_in[d, 14] = 0.0 if x < 0.0 else x
        z = (eff[d] - eff_mean) / (eff_std + 1e-3)
        dc_in[d, 15] = min(max(z, -5.0), 5.0)
        dc_in[d, 16] = eff[d]
        dc_in[d, 17] = float(n) * inv_engines[d]
        dc_in[d, 18] = sin_t
        dc_in[d, 19] = cos_t
        if demand:
            dc_in[d, 20] = tot0 * inv_engines[d]
            dc_in[d, 21] = tot1 * inv_engines[d]
    # ---- datacenter encoder and context
    e1 = _affine(_relu_affine(dc_in, W_e1, b_e1), W_e2, b_e2)
    h = e1.shape[1]
    ctx = _affine(_row_mean(e1), W_c_ctx, b_c)  # (1, h)
    e = _relu_affine(e1, W_c_own, ctx[0])
    # ---- classes: slot encoder, pair layer, defer head
    ed = _affine(e, W_pd, b_pd)  # (D, h)
    dctx = _affine(_row_mean(e), W_d_c, b_d1)
    bias = c_sd.copy()
    for j in range(h):
        bias[h + j] += dctx[0, j]
    # [slot part of the pair layer | defer pre-activation] (C, 2h), from the slot encoder's hidden
    # layer: _affine(_relu_affine(crow[:, :3], W_s1, b_s1), M_sd, bias), fused per class (the same
    # sums in the same order; _affine's skipped zero terms add +-0.0 to sums that start at +0.0,
    # which changes no bit), into the slot part ``sp`` and the defer layer ``hd`` after its ReLU
    sp, hd = _slot_layers(crow, W_s1, b_s1, M_sd, bias, h)
    logits = np.empty((C, D + 1))
    head = np.empty((C, D))
    edT = ed.T.copy()  # (h, D)
    a0 = np.empty(D)
    a1 = np.empty(D)
    a3 = np.empty(D)
    acc = np.empty(D)
    pre_s = np.empty(D)  # (the two datacenter columns read per class, as contiguous vectors)
    wait_s = np.empty(D)
    for d in range(D):
        pre_s[d] = dc[d, c_prefill]
        wait_s[d] = dc[d, c_wait]
    for c in range(C):
        prompt = crow[c, 0]
        waited = crow[c, 2]
        best = 1e3
        if n_up:
            best = np.inf
            for d in range(D):  # (without a branch per datacenter: which one is nearest varies)
                v = crow[c, 3 + d] if up[d] else np.inf
                best = v if v < best else best
        for d in range(D):
            net = crow[c, 3 + d]
            x1 = net - best
            a0[d] = net
            a1[d] = min(0.0 if x1 < 0.0 else x1, 10.0)
            server = pre_s[d] * prompt
            server += wait_s[d]
            hr = 1.0 - (waited + net + server)
            head[c, d] = min(max(hr, -10.0), 2.0)
            a3[d] = min(server, 10.0)
            acc[d] = 0.0
        # per (class, datacenter): relu(inputs @ W_pp + ed + sp) . w_out, summed over j in order
        for j in range(h):
            w0 = W_pp[0, j]
            w1 = W_pp[1, j]
            w2 = W_pp[2, j]
            w3 = W_pp[3, j]
            spj = sp[c, j]
            wo = w_out[j]
            for d in range(D):
                v = a0[d] * w0 + a1[d] * w1 + head[c, d] * w2 + a3[d] * w3
                v += edT[j, d]
                v += spj
                acc[d] += (0.0 if v < 0.0 else v) * wo
        for d in range(D):
            logits[c, d] = acc[d] + b_out
        dsum = 0.0
        for j in range(h):
            dsum += hd[c, j] * w_d2[j]
        logits[c, D] = dsum + b_d2
    # ---- load feedback (class sizes as row weights)
    if load_feedback:
        e_part = _affine(e, W_f_e, b_f1)  # (D, h)
        for _ in range(load_feedback):
            # the requests, prompt tokens and output tokens each datacenter would get (three
            # vectors rather than a (D, 3) array: the loop over datacenters vectorises)
            load_n = np.zeros(D)
            load_p = np.zeros(D)
            load_o = np.zeros(D)
            zc = np.empty(D + 1)
            for c in range(C):
                tot = _softmax_row(logits, c, up, zc)
                cnt = np.float64(counts[c])
                cnt_p = cnt * crow[c, 0]
                cnt_o = cnt * crow[c, 1]
                for d in range(D):
                    p = zc[d] / tot
                    load_n[d] += p * cnt
                    load_p[d] += p * cnt_p
                    load_o[d] += p * cnt_o
            corr = np.empty(D)
            for d in range(D):
                load_n[d] *= inv_engines[d]
                load_p[d] *= inv_engines[d]
                load_o[d] *= inv_engines[d]
                acc = 0.0
                for j in range(h):
                    v = e_part[d, j] + (load_n[d] * W_f_l[0, j] + load_p[d] * W_f_l[1, j] + load_o[d] * W_f_l[2, j])
                    if not v < 0.0:
                        acc += v * w_f2[j]
                corr[d] = acc + b_f2
            for c in range(C):
                for d in range(D):
                    logits[c, d] += corr[d]
    # ---- safety knobs
    if headroom_penalty != 0.0:
        for c in range(C):
            for d in range(D):
                x = head[c, d] - headroom_margin
                logits[c, d] += headroom_penalty * (x if x < 0.0 else 0.0)
    if load_price != 0.0:
        req = np.zeros(D)
        zc = np.empty(D + 1)
        for c in range(C):
            tot = _softmax_row(logits, c, up, zc)
            for d in range(D):
                req[d] += np.float64(counts[c]) * (zc[d] / tot)
        mean = 0.0
        if n_up:
            for d in range(D):
                req[d] *= inv_engines[d] * 16.0
                if up[d]:
                    mean += req[d]
            mean /= n_up
        else:
            for d in range(D):
                req[d] *= inv_engines[d] * 16.0
        for c in range(C):
            for d in range(D):
                logits[c, d] -= load_price * (req[d] - mean)
    return logits


def _class_quotas(logits: np.ndarray, mask_row: np.ndarray, counts: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Cumulative quotas (C, D + 1) of the systematic split (:func:`train.fast.systematic_sorted`):
    members 0 .. quota[c, 0] - 1 of class c (in its sorted order) take choice 0, members
    quota[c, 0] .. quota[c, 1] - 1 choice 1, and so on; quota[c, D] = counts[c]."""
    C, C1 = logits.shape
    bound = np.empty((C, C1), dtype=np.int64)
    cdf = np.empty(C1)
    for c in range(C):
        mx = -np.inf
        for d in range(C1):  # (selects, not branches: where the maximum lies varies)
            v = logits[c, d] if mask_row[d] else MASKED_LOGIT
            mx = v if v > mx else mx
        for d in range(C1):  # (a loop of its own: it vectorises)
            v = logits[c, d] if mask_row[d] else MASKED_LOGIT
            cdf[d] = _exp(v - mx)
        acc = 0.0
        for d in range(C1):
            acc += cdf[d]
            cdf[d] = acc
        last = cdf[C1 - 1]
        nc = counts[c]
        uc = u[c]
        for d in range(C1):  # (the float part in a loop of its own: it vectorises)
            x = cdf[d] / last
            x *= nc
            x -= uc
            cdf[d] = np.ceil(x)
        prev_edge = 0
        given = 0
        for d in range(C1 - 1):  # (without branches: most choices of a small class get no member)
            edge = np.int64(cdf[d])
            k = edge - prev_edge
            prev_edge = edge
            given += k if k > 0 else 0
            bound[c, d] = given if given < nc else nc
        edge = np.int64(cdf[C1 - 1])
        k = edge - prev_edge + (nc - edge)  # (the last choice takes the rest)
        given += k if k > 0 else 0
        bound[c, C1 - 1] = given if given < nc else nc
    return bound


def _systematic_rows(logits: np.ndarray, mask_row: np.ndarray, counts: np.ndarray, u: np.ndarray,
                     order: np.ndarray) -> np.ndarray:
    """Choices per row (row order) of the systematic split (:func:`train.fast.systematic_sorted`
    written back through ``order``)."""
    bound = _class_quotas(logits, mask_row, counts, u)
    pick = np.empty(order.shape[0], dtype=np.int64)
    j = 0
    for c in range(counts.shape[0]):
        d = 0
        for r in range(counts[c]):
            while r >= bound[c, d]:
                d += 1
            pick[order[j + r]] = d
        j += counts[c]
    return pick


def _fill_systematic(logits: np.ndarray, mask_row: np.ndarray, counts: np.ndarray, u: np.ndarray,
                     row_class: np.ndarray, action: np.ndarray) -> None:
    """The choices of :func:`_systematic_rows` written into ``action`` (K,) for rows 0..n-1 (n =
    len(row_class), the class of each row), and defer (D) for the other K - n slots: member r
    (in row order, the sorted order) of class c takes the first choice whose quota exceeds r, so
    the choices are the same, without the sort."""
    C, C1 = logits.shape
    bound = _class_quotas(logits, mask_row, counts, u)
    rank = np.zeros(C, dtype=np.int64)
    cur = np.zeros(C, dtype=np.int64)
    for i in range(row_class.shape[0]):
        c = row_class[i]
        r = rank[c]
        rank[c] = r + 1
        d = cur[c]
        while r >= bound[c, d]:
            d += 1
        cur[c] = d
        action[i] = d
    for i in range(row_class.shape[0], action.shape[0]):
        action[i] = C1 - 1


#: The bins of :func:`_prefix_classes` and the arguments of :func:`_logits_of_classes`
#: (per-datacenter scales, weights, knobs), in argument order, packed by
#: :meth:`JitSetScorer.bind` into one float64 buffer (scalars as 1 x 1 entries): one argument of
#: :func:`_decide` instead of about 30.
_PACKED = ("out_edges", "used_edges", "origin_key", "inv_engines",
           "W_e1", "b_e1", "W_e2", "b_e2", "W_c_own", "W_c_ctx", "b_c", "W_s1", "b_s1", "M_sd", "c_sd",
           "W_pd", "b_pd", "W_pp", "w_out", "b_out", "W_d_c", "b_d1", "w_d2", "b_d2",
           "W_f_e", "W_f_l", "b_f1", "w_f2", "b_f2", "knobs")
#: Integer header of the packed layout: s_valid, n_out, n_keys, load_feedback, demand, number of
#: icol entries; then icol; then (offset, rows, cols) of each of _PACKED. The last packed entry,
#: "knobs", holds headroom_penalty, headroom_margin, load_price and n_fmean.
_HEAD = 6


def _vec(fp: np.ndarray, ip: np.ndarray, k: int) -> np.ndarray:
    """Entry ``k`` of :data:`_PACKED` as a vector (a view of the packed buffer)."""
    base = _HEAD + ip[5] + 3 * k
    o = ip[base]
    return fp[o:o + ip[base + 1] * ip[base + 2]]


def _mat(fp: np.ndarray, ip: np.ndarray, k: int) -> np.ndarray:
    """Entry ``k`` of :data:`_PACKED` as a (rows, cols) matrix (a view of the packed buffer)."""
    base = _HEAD + ip[5] + 3 * k
    o = ip[base]
    r = ip[base + 1]
    c = ip[base + 2]
    return fp[o:o + r * c].reshape((r, c))


def _decide(slots_flat: np.ndarray, mask: np.ndarray, dc_flat: np.ndarray, gl: np.ndarray, n_hint: int,
            systematic: bool, ip: np.ndarray, fp: np.ndarray, table: np.ndarray, ubuf: np.ndarray, upos: np.ndarray,
            action: np.ndarray):
    """One decision in one compiled call, into ``action`` (K,): (status, n). status 0:
    ``action`` holds the systematic choices (valid slots 0..n-1, one mask for all of them,
    ``systematic`` set; its C uniforms taken from ``ubuf`` at ``upos[0]``, which moves on by C)
    and defer for the other slots; 1: the valid slots are 0..n-1 but the choice is left to the
    caller (per-request masks or another mode); 2: the valid slots are not 0..n-1; 3: fewer
    uniforms are left in ``ubuf`` than ``n_hint`` (checked first, when ``systematic``) or than
    the C classes (checked when they are known): none is taken, n is not computed (0) in the
    first case. With status 1, 2 or 3 ``action`` is scratch. ``ip`` / ``fp``: the layout and
    the weights packed by :meth:`JitSetScorer.bind`. The caller allocates ``action``: a
    returned array would cost a boxing that, cold, takes longer than a small loop."""
    K = mask.shape[0]
    D = mask.shape[1] - 1
    if systematic and upos[0] + min(n_hint, K) > ubuf.shape[0]:  # (as many classes as requests, at most)
        return 3, 0
    slots = slots_flat.reshape((K, slots_flat.shape[0] // K))
    dc32 = dc_flat.reshape((D, dc_flat.shape[0] // D))
    icol = ip[_HEAD:_HEAD + ip[5]]
    prefix, n, decidable, crow, row_class, counts = _prefix_classes(
        slots, mask, n_hint, ip[0], table, dc32, icol, _vec(fp, ip, 0), _vec(fp, ip, 1), _vec(fp, ip, 2), ip[2],
        systematic)
    if not prefix:
        return 2, n
    if not decidable:
        return 1, n
    if n == 0:
        for i in range(K):
            action[i] = D
        return 0, n
    knobs = _vec(fp, ip, 29)
    logits = _logits_of_classes(
        crow, counts, n, dc32, gl, icol, _vec(fp, ip, 3), knobs[3],
        _mat(fp, ip, 4), _vec(fp, ip, 5), _mat(fp, ip, 6), _vec(fp, ip, 7), _mat(fp, ip, 8), _mat(fp, ip, 9),
        _vec(fp, ip, 10), _mat(fp, ip, 11), _vec(fp, ip, 12), _mat(fp, ip, 13), _vec(fp, ip, 14), _mat(fp, ip, 15),
        _vec(fp, ip, 16), _mat(fp, ip, 17), _vec(fp, ip, 18), _vec(fp, ip, 19)[0], _mat(fp, ip, 20), _vec(fp, ip, 21),
        _vec(fp, ip, 22), _vec(fp, ip, 23)[0], ip[3], _mat(fp, ip, 24), _mat(fp, ip, 25), _vec(fp, ip, 26),
        _vec(fp, ip, 27), _vec(fp, ip, 28)[0], ip[4] != 0, knobs[0], knobs[1], knobs[2])
    C = counts.shape[0]
    p = upos[0]
    if p + C > ubuf.shape[0]:  # (fewer uniforms left than classes, after a wrong hint: the caller draws more)
        return 3, n
    _fill_systematic(logits, mask[0], counts, ubuf[p:p + C], row_class, action)
    upos[0] = p + C
    return 0, n


if _njit is not None:  # pragma: no branch
    from llvmlite import ir as _ir
    from numba.core import types as _types
    from numba.extending import intrinsic as _intrinsic

    @_intrinsic
    def _f64_bits(typingctx: Any, x: Any) -> Any:  # noqa: F811 - the compiled bitcast
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.bitcast(args[0], _ir.IntType(64))

        return _types.int64(_types.float64), codegen

    @_intrinsic
    def _bits_f64(typingctx: Any, b: Any) -> Any:  # noqa: F811 - the compiled bitcast
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.bitcast(args[0], _ir.DoubleType())

        return _types.float64(_types.int64), codegen

    _exp = _nb.njit(cache=True, nogil=True, inline="always")(_exp)
    _count_le = _njit(_count_le)
    _np_sum = _njit(_np_sum)
    _softmax_row = _njit(_softmax_row)
    _row_mean = _njit(_row_mean)
    _relu_affine = _njit(_relu_affine)
    _affine = _njit(_affine)
    _mean_prefill32 = _njit(_mean_prefill32)
    _class_keys = _njit(_class_keys)
    _class_means = _njit(_class_means)
    _slot_layers = _njit(_slot_layers)
    _logits_of_classes = _njit(_logits_of_classes)
    _class_logits_jit = _njit(_class_logits)
    _class_quotas = _njit(_class_quotas)
    _fill_systematic = _njit(_fill_systematic)
    _prefix_classes = _njit(_prefix_classes)
    # (inlined when _decide is typed: one specialisation per literal index otherwise)
    _vec = _nb.njit(cache=True, nogil=True, inline="always")(_vec)
    _mat = _nb.njit(cache=True, nogil=True, inline="always")(_mat)
    _decide_jit = _njit(_decide)
    _systematic_rows_jit = _njit(_systematic_rows)


class JitSetScorer:
    """Compiled class logits and systematic choices of a class :class:`~train.set_policy.SetNetwork`.

    Wraps a float64 :class:`~train.fast.NumpySetScorer` (weights, layout columns, bins, safety
    knobs: set them on :attr:`ref`) and runs its computation compiled. Requires numba
    (:func:`available`) and a class network. Not for concurrent use from several threads: a
    decision uses a scratch table the scorer owns.
    """

    def __init__(self, net: Any) -> None:
        if not available():
            from carbon_gym.errors import ConfigError

            raise ConfigError("backend", "backend 'numba' needs numba (pip install -e '.[fast]')",
                              allowed=["numpy", "torch"])
        self.ref = NumpySetScorer(net, dtype=np.float64)
        if self.ref.classes is None:
            from carbon_gym.errors import ConfigError

            raise ConfigError("backend", "backend 'numba' needs a class network (SetNetwork(classes=...))",
                              allowed=["numpy", "torch"])
        self.bind(net.spec)
        self._warm_up()

    def bind(self, spec: Any) -> "JitSetScorer":
        """Read observations of the layout ``spec`` (as :meth:`NumpySetScorer.bind`)."""
        r = self.ref
        r.bind(spec)
        self.D, self.K, self.F_D, self.F_S = r.D, r.K, r.F_D, r.F_S
        fm = r._c_fmean
        self._icol = np.array([r._s_origin, r._s_prompt, r._s_pred, r._s_waited, r._s_net, r._c_now, r._c_f1,
                               fm.start if fm is not None else 0, r._c_pue, r._c_up, r._c_wait, r._c_prefill,
                               r._g_sin, r._g_cos] + list(r._c_obs), dtype=np.int64)
        self._n_fmean = r._n_fmean if fm is not None else 0.0
        n_out = len(r._out_edges) + 1
        self._n_keys = r.R * n_out * _USED_BINS
        self._table = np.zeros(self._n_keys, dtype=np.int64)  # scratch of _decide (zeros between calls)
        z = np.zeros(0)
        lf = r.load_feedback
        self._weights = (
            r.W_e1, r.b_e1, r.W_e2, r.b_e2, r.W_c_own, r.W_c_ctx, r.b_c, r.W_s1, r.b_s1,
            np.ascontiguousarray(np.hstack([r.W_s2 @ r.W_ps, r.W_s2 @ r.W_d_s])),
            np.concatenate([r.b_s2 @ r.W_ps, r.b_s2 @ r.W_d_s]),
            r.W_pd, r.b_pd, r.W_pp, r.w_out, r.b_out, r.W_d_c, r.b_d1, r.w_d2, r.b_d2,
            lf, r.W_f_e if lf else z.reshape(0, 0), r.W_f_l if lf else z.reshape(0, 0), r.b_f1 if lf else z,
            r.w_f2 if lf else z, r.b_f2 if lf else 0.0,
        )
        # the same, packed for _decide (entries of _PACKED; scalars as 1 x 1)
        w = self._weights
        entries = [r._out_edges, r._used_edges, r._origin_key, r._inv_engines, *w[:20], *w[21:],
                   np.array([r.headroom_penalty, r.headroom_margin, r.load_price, self._n_fmean])]
        assert len(entries) == len(_PACKED)
        ip = [r._s_valid, n_out, self._n_keys, lf, int(bool(r.demand_features)), len(self._icol), *self._icol]
        parts, at = [], 0
        for e in entries:
            a = np.asarray(e, dtype=np.float64)
            rows, cols = (a.shape if a.ndim == 2 else (1, a.size))
            ip += [at, rows, cols]
            parts.append(a.reshape(-1))
            at += a.size
        self._fp = np.ascontiguousarray(np.concatenate(parts))
        self._ip = np.array(ip, dtype=np.int64)
        self._knob_at = at - 4
        self._sizes = (self.K * self.F_S, (self.K, self.D + 1), self.D * self.F_D)
        self._knobs = (r.headroom_penalty, r.headroom_margin, r.load_price)
        self._g_max = max(r._g_sin, r._g_cos)
        return self

    @property
    def _last(self) -> Any:
        return self.ref._last

    def class_logits(self, dc_flat: np.ndarray, rows: np.ndarray, gl: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(logits (C, D + 1), order (n,) - rows sorted by class -, first position of each class
        in ``order`` (C,), class sizes (C,)) for the valid slot ``rows`` (n >= 1, F_S). Rows and
        datacenter rows are read as float32, the observation space's dtype."""
        r = self.ref
        dc = np.asarray(dc_flat, dtype=np.float32).reshape(self.D, self.F_D)
        rows32 = np.ascontiguousarray(rows, dtype=np.float32)
        g = np.asarray(gl, dtype=np.float32)
        return _class_logits_jit(
            rows32, dc, g, self._icol, r._out_edges, r._used_edges,
            r._origin_key, len(r._out_edges) + 1, self._n_keys, r._inv_engines, self._n_fmean, *self._weights,
            r.demand_features, float(r.headroom_penalty), float(r.headroom_margin), float(r.load_price),
        )

    def decide(self, slots: Any, mask: Any, dc_flat: Any, gl: Any, n_hint: int, systematic: bool,
               uniforms: UniformStream) -> tuple[int, int, np.ndarray]:
        """One decision in one compiled call, from the flat float32 ``slots`` (K * F_S), the (K,
        D + 1) bool ``mask``, the flat float32 datacenter rows and globals (others are converted
        to those: C-contiguous, aligned, writeable; :class:`~carbon_gym.errors.ConfigError` if a
        size is not the bound layout's): (status, n, action), see :func:`_decide`. ``n_hint``:
        the number of valid slots if known (the env's ``info["pending"]``, at most K; -1: scan all
        K slots); when it is given, slots 0..n_hint - 1 are checked valid and slots n_hint and
        K - 1 invalid, and the slots in between are not read. With status 0, the action holds
        the choices of :meth:`systematic` on :meth:`class_logits` of ``slots[:n]``, from the same
        uniforms (taken from ``uniforms``); with status 1 (valid slots 0..n-1) or 2 (valid slots
        elsewhere) the caller decides, with :meth:`class_logits`. (Status 3, too few uniforms
        drawn ahead, is handled here: K more are drawn and the call is repeated; the compiled
        call checks the hint against the uniforms left first, so this costs little.)

        Kept to few Python operations, each array checked once: on a machine that has just run
        an env step, each costs about as much as a small compiled loop. The arrays, of the
        compiled signature's types (checked here: the entry point does not check them), go
        straight to the compiled entry point, without numba's dispatcher; the action array is
        allocated here and the call returns two integers (boxing a returned array costs more)."""
        if not (type(slots) is np.ndarray and slots.dtype is _F32 and slots.ndim == 1 and slots.flags.carray):
            slots = np.require(slots, np.float32, "CAW").reshape(-1)
        if not (type(dc_flat) is np.ndarray and dc_flat.dtype is _F32 and dc_flat.ndim == 1 and dc_flat.flags.carray):
            dc_flat = np.require(dc_flat, np.float32, "CAW").reshape(-1)
        if not (type(gl) is np.ndarray and gl.dtype is _F32 and gl.ndim == 1 and gl.flags.carray):
            gl = np.require(gl, np.float32, "CAW").reshape(-1)
        if not (type(mask) is np.ndarray and mask.dtype is _BOOL and mask.flags.carray):
            mask = np.require(mask, np.bool_, "CAW")
        if (slots.shape[0], mask.shape, dc_flat.shape[0]) != self._sizes or gl.shape[0] <= self._g_max:
            from carbon_gym.errors import ConfigError

            raise ConfigError("observation", f"expected {self.K} x {self.F_S} slot values, a ({self.K}, {self.D + 1}) "
                              f"mask, {self.D} x {self.F_D} datacenter values and more than {self._g_max} globals (the "
                              f"layout bound by reset(env)); got {slots.shape[0]}, {mask.shape}, {dc_flat.shape[0]} "
                              f"and {gl.shape[0]}")
        r = self.ref
        knobs = (r.headroom_penalty, r.headroom_margin, r.load_price)
        if knobs != self._knobs:  # (the knobs are attributes of ref, set after bind)
            self._fp[self._knob_at:self._knob_at + 3] = knobs
            self._knobs = knobs
        n_hint = int(n_hint)
        systematic = bool(systematic)
        action = np.empty(self.K, dtype=np.int64)
        call = self._entry if self._entry is not None else _decide_jit
        status, n = call(slots, mask, dc_flat, gl, n_hint, systematic, self._ip, self._fp, self._table,
                         uniforms.buf, uniforms.pos, action)
        if status == 3:
            # one uniform per class, at most one class per request: K are always enough (drawn
            # ahead in blocks, so this happens every few dozen steps, at the call's first check)
            uniforms.reserve(self.K)
            status, n = call(slots, mask, dc_flat, gl, n_hint, systematic, self._ip, self._fp, self._table,
                             uniforms.buf, uniforms.pos, action)
        return status, n, action

    def systematic(self, logits: np.ndarray, mask_row: np.ndarray, counts: np.ndarray, order: np.ndarray,
                   rng: np.random.Generator | UniformStream) -> np.ndarray:
        """Systematic choices per row (row order), one uniform per class drawn from ``rng`` (the
        draws of :func:`train.fast.systematic_sorted`)."""
        u = rng.random(counts.shape[0])
        return _systematic_rows_jit(logits, np.ascontiguousarray(mask_row, dtype=np.bool_), counts, u, order)

    def _warm_up(self) -> None:
        """Compile (or load from numba's cache) the functions on a tiny input of this layout."""
        rows = np.zeros((2, self.F_S), dtype=np.float32)
        rows[:, self.ref._s_origin] = 1.0
        dc = np.zeros(self.D * self.F_D, dtype=np.float32)
        gl = np.zeros(8, dtype=np.float32)
        lg, order, _, counts = self.class_logits(dc, rows, gl)
        self.systematic(lg, np.ones(self.D + 1, dtype=bool), counts, order, np.random.default_rng(0))
        rows[:, self.ref._s_valid] = 1.0
        mask = np.ones((2, self.D + 1), dtype=bool)
        us = UniformStream(np.random.default_rng(0))
        us.reserve(2)
        for hint in (-1, 2):  # (the same argument types as decide's, on 2 slots)
            _decide_jit(rows.reshape(-1), mask, dc, gl, hint, True, self._ip, self._fp, np.zeros_like(self._table),
                        us.buf, us.pos, np.empty(2, dtype=np.int64))
        t = _nb.types
        f32, i64, f64 = (t.Array(dt, 1, "C") for dt in (t.float32, t.int64, t.float64))
        cres = _decide_jit.overloads.get((f32, t.Array(t.boolean, 2, "C"), f32, f32, t.int64, t.boolean, i64, f64, i64,
                                          f64, i64, i64))
        self._entry = cres.entry_point if cres is not None else None  # (None: every call goes through the dispatcher)
