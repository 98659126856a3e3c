"""Pure-numpy inference of the set policy: the decision path of :class:`train.policy.LearnedPolicy`.

:class:`NumpySetScorer` holds the weights of a :class:`~train.set_policy.SetNetwork` as numpy
arrays and computes the same logits for one (unbatched) observation without torch: no tensor
creation, no autograd or dispatcher overhead per step. With a class network
(``SetNetwork(classes=...)``) it groups the pending requests into classes first (one sort of
integer keys) and scores each class once: C classes x D datacenters pairs instead of
n requests x D (about 200 classes for ~1,600 requests at llama8b-moderate). Without classes
every request is its own class.

:func:`choose` turns the class logits into per-request choices: ``"argmax"``, ``"sample"``
(independent draws per request, one uniform each, inverse CDF) or ``"systematic"`` (one uniform
per class: the members of a class are split over the datacenters in proportion to the class's
probabilities, each choice getting the floor or the ceiling of its expected count).

``tests/test_train_fast.py`` checks that the numpy logits equal the torch network's (float64:
1e-9; float32 network: 1e-4) on random and real observations, with and without classes.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from carbon_gym.errors import ConfigError

from .set_policy import _USED_BINS, MASKED_LOGIT, class_bin_edges

__all__ = ["NumpySetScorer", "choose", "systematic_sorted", "CHOICE_MODES", "SAFETY_KNOBS"]

#: Inference-time safety knobs of :class:`NumpySetScorer` (added to the datacenter logits after
#: the network, including its load-feedback pass; a zero penalty / price is neutral: the code path
#: is skipped and the logits are exactly the network's).
#: ``headroom_penalty`` beta (>= 0, logit per TTFT SLO) with ``headroom_margin`` m (SLO units):
#: ``+ beta x min(headroom_cd - m, 0)``, headroom = ``1 - (waited + network + queue wait +
#: prefill) / T_ttft``, the network's own pair input (clipped to [-10, 2]): a (class, datacenter)
#: pair with less estimated TTFT headroom than m loses score in proportion to the shortfall, so
#: requests that have used much of their TTFT budget move to closer / less-queued datacenters.
#: (The estimate is optimistic: in llama8b episodes it is never below 0, so m > 0 is needed.)
#: ``load_price`` gamma (>= 0, logit per request per engine): ``- gamma x (r_d - mean_d r_d)``,
#: r_d the requests per engine that the choice probabilities would send to datacenter d this step
#: (mean over datacenters that are up): load moves from datacenters proposed more than average
#: toward the rest (one pass). Measured trade-offs: train/RESULTS_TRAIN.md ("Safety knobs").
SAFETY_KNOBS = ("load_price", "headroom_penalty", "headroom_margin")

CHOICE_MODES = ("sample", "argmax", "systematic")
#: Datacenter inputs that are observation columns (carbon now, next hour, the 11 observed ones).
_DC_TAKEN = np.array([0, 1] + list(range(3, 14)))


def _np(t: Any) -> np.ndarray:
    return t.detach().cpu().double().numpy().copy()


def _ceil32(edges: np.ndarray) -> np.ndarray:
    """The smallest float32 >= each float64 edge."""
    e32 = edges.astype(np.float32)
    return np.where(e32.astype(np.float64) < edges, np.nextafter(e32, np.float32(np.inf)), e32)


class NumpySetScorer:
    """The logits of a :class:`~train.set_policy.SetNetwork`, computed with numpy (float64).

    Args:
        net: the torch network (weights are copied; later changes to ``net`` are not seen).
    Call :meth:`bind` with the env's layout (done at construction with the network's), then
    :meth:`class_logits` once per step.
    """

    def __init__(self, net: Any) -> None:
        h = int(net.hidden)
        self.hidden = h
        self.classes = dict(net.classes) if net.classes is not None else None
        self.demand_features = bool(net.demand_features)
        enc = net.dc_encoder
        self.W_e1, self.b_e1 = _np(enc[0].weight).T.copy(), _np(enc[0].bias)
        self.W_e2, self.b_e2 = _np(enc[2].weight).T.copy(), _np(enc[2].bias)
        wc = _np(net.dc_context.weight).T  # (2h, h): [own, mean]
        self.W_c_own, self.W_c_ctx, self.b_c = wc[:h].copy(), wc[h:].copy(), _np(net.dc_context.bias)
        se = net.slot_encoder
        self.W_s1, self.b_s1 = _np(se[0].weight).T.copy(), _np(se[0].bias)
        self.W_s2, self.b_s2 = _np(se[2].weight).T.copy(), _np(se[2].bias)
        self.W_pd, self.b_pd = _np(net.pair_from_dc.weight).T.copy(), _np(net.pair_from_dc.bias)
        self.W_ps = _np(net.pair_from_slot.weight).T.copy()
        self.W_pp = _np(net.pair_from_pair.weight).T.copy()  # (4, h)
        self.w_out, self.b_out = _np(net.pair_out.weight).reshape(-1), float(_np(net.pair_out.bias)[0])
        dh = net.defer_head
        wd = _np(dh[0].weight).T  # (2h, h): [slot, context]
        self.W_d_s, self.W_d_c, self.b_d1 = wd[:h].copy(), wd[h:].copy(), _np(dh[0].bias)
        self.w_d2, self.b_d2 = _np(dh[2].weight).reshape(-1), float(_np(dh[2].bias)[0])
        # the slot encoder's output layer folded into the pair and defer layers: the slot part of
        # both from the encoder's hidden layer in one product, [W_s2 @ W_ps | W_s2 @ W_d_s]
        self._M_sd = np.hstack([self.W_s2 @ self.W_ps, self.W_s2 @ self.W_d_s])
        self._c_sd = np.concatenate([self.b_s2 @ self.W_ps, self.b_s2 @ self.W_d_s])
        #: The network's :attr:`~train.set_policy.SetNetwork.count_scale` (per-step request
        #: counts read as the training period's), copied; :class:`train.policy.LearnedPolicy` sets both.
        self.count_scale = float(getattr(net, "count_scale", 1.0))
        self.load_feedback = int(getattr(net, "load_feedback", 0))
        if self.load_feedback:
            fb = net.fb_head
            wf = _np(fb[0].weight).T  # (h + 3, h): [embedding, load]
            self.W_f_e, self.W_f_l, self.b_f1 = wf[:h].copy(), wf[h:].copy(), _np(fb[0].bias)
            self.w_f2, self.b_f2 = _np(fb[2].weight).reshape(-1), float(_np(fb[2].bias)[0])
        self.n_dc_inputs = self.W_e1.shape[0]
        self.capacity_head = bool(getattr(net, "capacity_head", False))
        if self.capacity_head:
            ck = net.cap_head
            wk = _np(ck[0].weight).T  # (h + 3, h): [embedding, candidate inputs]
            self.W_k_e, self.W_k_x, self.b_k1 = wk[:h].copy(), wk[h:].copy(), _np(ck[0].bias)
            self.w_k2, self.b_k2 = _np(ck[2].weight).reshape(-1), float(_np(ck[2].bias)[0])
        self._last_e: np.ndarray | None = None
        self._last_n = 0.0
        #: Inference-time safety knobs (0 = the network's own logits; see :data:`SAFETY_KNOBS`).
        self.load_price = 0.0
        self.headroom_penalty = 0.0
        self.headroom_margin = 0.0
        if self.classes is not None:
            self._out_edges, self._used_edges = class_bin_edges(self.classes)
            # x >= edge <=> x >= the smallest float32 >= edge, for float32 x: the bins of float32
            # inputs without converting them
            self._out_t32, self._used_t32 = _ceil32(self._out_edges), _ceil32(self._used_edges)
        self.bind(net.spec)

    def bind(self, spec: Mapping[str, Any]) -> NumpySetScorer:
        """Read observations of the layout ``spec`` (:func:`train.set_policy.layout_spec`)."""
        from .set_policy import FORECAST_MEAN_HOURS, layout_spec

        spec = layout_spec(spec)
        self.D, self.K = int(spec["n_datacenters"]), int(spec["max_pending"])
        self.F_D, self.F_S, self.R = int(spec["n_dc_features"]), int(spec["n_slot_features"]), int(spec["n_regions"])
        H = int(spec["forecast_hours"])
        c, s, g = spec["dc_columns"], spec["slot_columns"], spec["global_columns"]
        self._c_now = c["carbon_now"]
        self._c_f1 = c["carbon_forecast_1h"] if H >= 1 else c["carbon_now"]
        self._c_fmean = slice(c["carbon_now"] + 1, c["carbon_now"] + 1 + min(H, FORECAST_MEAN_HOURS)) if H >= 1 else None
        self._n_fmean = float(min(H, FORECAST_MEAN_HOURS))
        self._c_obs = [c[n] for n in ("pue", "queue_len", "running", "free_kv", "power", "busy_engines",
                                      "est_queue_wait", "est_prefill", "est_tpot", "tpot_slope", "up")]
        self._c_pue, self._c_up = c["pue"], c["up"]
        self._c_wait, self._c_prefill = c["est_queue_wait"], c["est_prefill"]
        self._s_valid, self._s_origin = s["valid"], s["origin"]
        self._s_prompt, self._s_pred, self._s_waited, self._s_net = s["prompt"], s["predicted_output"], s["waited"], s["network"]
        self._g_sin, self._g_cos = g["hour_sin"], g["hour_cos"]
        # datacenter inputs 0, 1 and 3..13 are observation columns, gathered in one step
        self._dc_take = np.array([self._c_now, self._c_f1] + self._c_obs)
        self._engines = np.asarray(spec["n_engines"], dtype=np.int64)
        engines = np.maximum(np.asarray(spec["n_engines"], dtype=np.float64), 1.0)
        # the torch network keeps 1 / (engines x 16) as float32
        self._inv_engines = (1.0 / (engines * 16.0)).astype(np.float32).astype(np.float64)
        self._cols = np.array([self._s_prompt, self._s_pred, self._s_waited] + list(range(self._s_net, self._s_net + self.D)))
        c0 = int(self._cols[0])
        contiguous = bool((self._cols == np.arange(c0, c0 + len(self._cols))).all())
        self._col_slice = slice(c0, c0 + len(self._cols)) if contiguous else None
        n_out = len(self._out_edges) + 1 if self.classes is not None else 1
        self._origin_key = (np.arange(self.R) * (n_out * _USED_BINS)).astype(np.float32)  # exact in float32
        # class keys are < R x n_out x (used bins + 1) (searchsorted returns up to len(edges))
        self._key_fits_int16 = self.R * n_out * (_USED_BINS + 1) < 2 ** 15
        # capacity head: candidate server counts n = 0..S of every datacenter (as SetNetwork.capacity_candidates)
        self._c_srv = c.get("servers_on")
        srv = spec.get("n_servers")
        self._n_servers = None if srv is None else np.maximum(np.asarray(srv, dtype=np.int64), 1)
        self._last_e = None
        if self._n_servers is not None:
            f32 = np.float32  # (the torch network computes the candidates in float32)
            k = np.maximum(np.asarray(spec["n_engines"], dtype=np.int64) // self._n_servers, 1)
            self.engines_per_node = k
            self._cap_n = np.arange(int(self._n_servers.max()) + 1)
            self._cap_frac = (self._cap_n[None, :].astype(f32) / self._n_servers[:, None].astype(f32)).astype(np.float64)
            self._cap_den = np.maximum(16.0 * self._cap_n[None, :] * k[:, None], 8.0).astype(f32).astype(np.float64)
            self._cap_mask = self._cap_n[None, :] <= self._n_servers[:, None]
        return self

    # ------------------------------------------------------------------ classes
    def group(self, rows: np.ndarray, dc: np.ndarray, inverse: bool = True) -> tuple[np.ndarray, Any, np.ndarray, np.ndarray]:
        """Classes of the valid slot ``rows`` (n, F_S): (class rows (C, 3 + D) = mean prompt,
        predicted output, waited and network of each class, float64; class of each row (n,),
        or None when ``inverse`` is False (a caller that uses :meth:`last_order` only); first row
        of each class (C,); members per class (C,)). Classes are in key order."""
        n = rows.shape[0]
        if self.classes is None:
            self._last = (np.arange(n), np.arange(n), np.ones(n, dtype=np.int64))
            return rows[:, self._cols].astype(np.float64), np.arange(n), np.arange(n), np.ones(n, dtype=np.int64)
        # keys as SetNetwork.class_keys: float32 inputs against the float64 bin edges
        rows = np.asarray(rows, dtype=np.float32)
        origin = rows[:, self._s_origin:self._s_origin + self.R] @ self._origin_key  # origin x (bins)
        key = np.searchsorted(self._out_t32, rows[:, self._s_pred], "right")
        key *= _USED_BINS
        up = dc[:, self._c_up] > 0.5
        pref = float(dc[:, self._c_prefill].astype(np.float64)[up].sum() / max(int(up.sum()), 1))
        used = rows[:, self._s_prompt] * pref  # (float32: the mean prefill rounded to float32 first)
        used += rows[:, self._s_waited]
        key += np.searchsorted(self._used_t32, used, "right")
        key += origin.astype(np.intp)
        if self._key_fits_int16:  # small keys: numpy's stable sort of int16 is a radix sort (same order)
            key = key.astype(np.int16)
        order = np.argsort(key, kind="stable")
        ks = key[order]
        brk = np.empty(n, dtype=bool)
        brk[0] = True
        np.not_equal(ks[1:], ks[:-1], out=brk[1:])
        starts = np.flatnonzero(brk)
        if inverse:
            inv = np.empty(n, dtype=np.intp)
            inv[order] = np.cumsum(brk) - 1
        else:
            inv = None
        counts = np.empty_like(starts)  # np.diff(starts, append=n), without its concatenation
        np.subtract(starts[1:], starts[:-1], out=counts[:-1])
        counts[-1] = n - starts[-1]
        self._last = (order, starts, counts)
        sorted_rows = np.take(rows, order, axis=0)
        cols = sorted_rows[:, self._col_slice] if self._col_slice is not None else sorted_rows[:, self._cols]
        sums = np.add.reduceat(cols, starts, axis=0, dtype=np.float64)
        sums /= counts[:, None]
        return sums, inv, order[starts], counts

    def last_order(self) -> np.ndarray:
        """Rows of the last :meth:`group` / :meth:`class_logits` call sorted by class (rank order
        inside a class): the order of :func:`systematic_sorted`'s choices."""
        return self._last[0]

    def last_ranks(self) -> np.ndarray:
        """Rank of every row inside its class (0 .. size - 1, in row order) for the rows of the
        last :meth:`group` / :meth:`class_logits` call (the ``rank`` argument of :func:`choose`)."""
        order, starts, counts = self._last
        n = order.shape[0]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - np.repeat(starts, counts)
        return rank

    # ------------------------------------------------------------------ logits
    def _embed(self, dc64: np.ndarray, n_rows: float, gl: np.ndarray, demand: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, bool]:
        """Datacenter embeddings (D, h) (as ``SetNetwork._dc_embed(dc_inputs(...))``), the up flags
        and whether all are up, from the datacenter rows (float64), the valid slots ``n_rows``, the
        globals and (with ``demand_features``) the pending prompt and predicted-output sums (2,)."""
        D = self.D
        # datacenter inputs (as SetNetwork.dc_inputs): the same values with few numpy calls
        up = dc64[:, self._c_up] > 0.5
        all_up = bool(up.all())
        dc_in = np.empty((D, self.n_dc_inputs))
        dc_in[:, _DC_TAKEN] = dc64[:, self._dc_take]
        dc_in[:, 2] = dc64[:, self._c_fmean].sum(axis=1) / self._n_fmean if self._c_fmean is not None else dc_in[:, 0]
        eff = np.multiply(dc_in[:, 0], dc64[:, self._c_pue], out=dc_in[:, 16])  # carbon x PUE
        eff_up = eff if all_up else eff[up]
        n_up = max(float(eff_up.shape[0]), 1.0)
        eff_mean = eff_up.sum() / n_up
        dev = eff_up - eff_mean
        eff_std = np.sqrt((dev * dev).sum() / n_up)
        np.maximum(eff - (eff_up.min() if eff_up.shape[0] else 1e3), 0.0, out=dc_in[:, 14])
        np.minimum(np.maximum((eff - eff_mean) / (eff_std + 1e-3), -5.0), 5.0, out=dc_in[:, 15])  # (np.clip costs more)
        np.multiply(n_rows, self._inv_engines, out=dc_in[:, 17])
        dc_in[:, 18:20] = (float(gl[self._g_sin]), float(gl[self._g_cos]))
        if self.demand_features:  # pending prompt and predicted-output tokens per engine
            np.multiply.outer(self._inv_engines, np.zeros(2) if demand is None else demand, out=dc_in[:, 20:22])
        e = np.maximum(dc_in @ self.W_e1 + self.b_e1, 0.0) @ self.W_e2 + self.b_e2
        e = np.maximum(e @ self.W_c_own + ((e.sum(axis=0) / D) @ self.W_c_ctx + self.b_c), 0.0)  # (D, h)
        return e, up, all_up

    def capacity_logits(self, dc_flat: np.ndarray, gl: np.ndarray, totals: np.ndarray | None = None) -> np.ndarray:
        """Logits (D, S + 1) of the capacity head (powered servers n = 0..S of each datacenter,
        masked beyond S_d; :meth:`train.set_policy.SetNetwork.capacity_scores`) for this step.
        ``totals`` = (valid slots, their prompt sum, their predicted-output sum) in observation
        units; None: those of the last :meth:`class_logits` call, whose embeddings are reused
        (call it first on the same observation), or no pending request when there was none."""
        if not self.capacity_head or self._n_servers is None or self._c_srv is None:
            raise ConfigError("capacity_head", "the capacity head needs an env with capacity control "
                              "([capacity] control = 'agent'): servers per datacenter and the servers_on column")
        dc64 = np.asarray(dc_flat, dtype=np.float32).reshape(self.D, self.F_D).astype(np.float64)
        if totals is None and self._last_e is not None:
            e, n_rows = self._last_e, self._last_n
        else:
            t = np.zeros(3) if totals is None else np.asarray(totals, dtype=np.float64) * self.count_scale
            n_rows = float(t[0])
            e, _, _ = self._embed(dc64, n_rows, gl, t[1:3])
        S = self._cap_n.shape[0] - 1
        x = np.empty((self.D, S + 1, 3))
        x[:, :, 0] = self._cap_frac
        np.subtract(self._cap_frac, dc64[:, self._c_srv][:, None], out=x[:, :, 1])
        np.minimum(n_rows / self._cap_den, 10.0, out=x[:, :, 2])
        pre = (x.reshape(-1, 3) @ self.W_k_x).reshape(self.D, S + 1, self.hidden)
        pre += (e @ self.W_k_e + self.b_k1)[:, None, :]
        np.maximum(pre, 0.0, out=pre)
        z = (pre.reshape(-1, self.hidden) @ self.w_k2).reshape(self.D, S + 1) + self.b_k2
        return np.where(self._cap_mask, z, MASKED_LOGIT)

    def class_logits(self, dc_flat: np.ndarray, rows: np.ndarray, gl: np.ndarray,
                     inverse: bool = True) -> tuple[np.ndarray, Any, np.ndarray, np.ndarray]:
        """Logits (C, D + 1) of the classes of the valid slot rows ``rows`` (n >= 1, F_S), the
        class of each row (n,; None when ``inverse`` is False, see :meth:`group`), the first row
        of each class (C,) and the class sizes (C,)."""
        D, h = self.D, self.hidden
        dc = np.asarray(dc_flat, dtype=np.float32).reshape(D, self.F_D)
        crow, inv, rep, counts = self.group(rows, dc, inverse)
        dc64 = dc.astype(np.float64)
        scale = self.count_scale
        demand = counts @ crow[:, :2] if self.demand_features else None
        if demand is not None and scale != 1.0:
            demand = demand * scale
        n_rows = float(rows.shape[0]) * scale
        e, up, all_up = self._embed(dc64, n_rows, gl, demand)
        self._last_e, self._last_n = e, n_rows
        # classes: slot encoder (its output layer folded into the pair and defer layers), pair
        # inputs, pair layer, defer head
        prompt, waited = crow[:, 0], crow[:, 2]
        net = crow[:, 3:]
        sd = np.maximum(crow[:, :3] @ self.W_s1 + self.b_s1, 0.0) @ self._M_sd + self._c_sd  # (C, 2h)
        C = crow.shape[0]
        pair_in = np.empty((C, D, 4))
        pair_in[:, :, 0] = net
        if all_up:
            net_best = net.min(axis=1, keepdims=True)
        else:
            net_best = net[:, up].min(axis=1, keepdims=True) if up.any() else np.full((C, 1), 1e3)
        np.minimum(np.maximum(net - net_best, 0.0), 10.0, out=pair_in[:, :, 1])
        server = np.multiply.outer(prompt, dc64[:, self._c_prefill])
        server += dc64[:, self._c_wait]
        headroom = waited[:, None] + net
        headroom += server
        np.subtract(1.0, headroom, out=headroom)
        np.minimum(np.maximum(headroom, -10.0), 2.0, out=pair_in[:, :, 2])
        np.minimum(server, 10.0, out=pair_in[:, :, 3])
        pre = (pair_in.reshape(C * D, 4) @ self.W_pp).reshape(C, D, h)
        pre += (e @ self.W_pd + self.b_pd)[None, :, :]
        pre += sd[:, None, :h]
        np.maximum(pre, 0.0, out=pre)
        logits = np.empty((C, D + 1))
        logits[:, :D] = (pre.reshape(C * D, h) @ self.w_out).reshape(C, D)
        logits[:, :D] += self.b_out
        hd = sd[:, h:]
        hd += (e.sum(axis=0) / D) @ self.W_d_c + self.b_d1
        np.maximum(hd, 0.0, out=hd)
        logits[:, D] = hd @ self.w_d2 + self.b_d2
        if self.load_feedback:  # as SetNetwork._feedback, with class sizes as the row weights
            cnt = counts.astype(np.float64)
            if scale != 1.0:
                cnt = cnt * scale
            load_w = np.empty((C, 3))  # requests, prompt and predicted-output tokens per class
            load_w[:, 0] = cnt
            np.multiply(cnt[:, None], crow[:, :2], out=load_w[:, 1:])
            e_part = e @ self.W_f_e + self.b_f1  # (D, h)
            for _ in range(self.load_feedback):
                lg = logits if all_up else np.concatenate([np.where(up[None, :], logits[:, :D], MASKED_LOGIT), logits[:, D:]], axis=1)
                z = np.exp(lg - lg.max(axis=1, keepdims=True))
                z /= z.sum(axis=1, keepdims=True)
                load = (z[:, :D].T @ load_w) * self._inv_engines[:, None]  # (D, 3)
                corr = np.maximum(e_part + load @ self.W_f_l, 0.0) @ self.w_f2 + self.b_f2
                logits[:, :D] += corr[None, :]
        if self.headroom_penalty:  # safety knob: estimated TTFT headroom below the margin, in SLOs
            logits[:, :D] += self.headroom_penalty * np.minimum(pair_in[:, :, 2] - self.headroom_margin, 0.0)
        if self.load_price:  # safety knob: price on the proposed requests per engine
            lg = logits if all_up else np.concatenate([np.where(up[None, :], logits[:, :D], MASKED_LOGIT), logits[:, D:]], axis=1)
            z = np.exp(lg - lg.max(axis=1, keepdims=True))
            z /= z.sum(axis=1, keepdims=True)
            req = (counts.astype(np.float64) @ z[:, :D]) * self._inv_engines * 16.0  # (D,) requests per engine
            if scale != 1.0:
                req = req * scale
            mean = req[up].mean() if up.any() else 0.0
            logits[:, :D] -= self.load_price * (req - mean)[None, :]
        return logits, inv, rep, counts


def systematic_sorted(logits: np.ndarray, mask_row: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Systematic choices of every request in class-sorted order (class by class, rank order
    inside a class), for one mask shared by all requests: class c (``counts[c]`` members, choice
    probabilities p_c) gives choice d to ``ceil(n_c F_cd - u_c) - ceil(n_c F_c,d-1 - u_c)`` members
    (F the CDF, u_c uniform): the same choices as :func:`choose` in ``"systematic"`` mode with
    the same generator state, without per-request arithmetic."""
    lg = logits if mask_row.all() else np.where(mask_row[None, :], logits, MASKED_LOGIT)
    p = np.exp(lg - lg.max(axis=1, keepdims=True))
    cdf = np.cumsum(p, axis=1)
    cdf /= cdf[:, -1:]
    C = counts.shape[0]
    u = rng.random(C)
    cdf *= counts[:, None]
    cdf -= u[:, None]
    edge = np.ceil(cdf).astype(np.int64)  # members with position (j + u) / n < F_cd
    k = edge.copy()  # np.diff(edge, axis=1, prepend=0)
    np.subtract(edge[:, 1:], edge[:, :-1], out=k[:, 1:])
    k[:, -1] += counts - edge[:, -1]  # F_c,last = 1: the remainder (0 up to rounding)
    C1 = logits.shape[1]
    np.maximum(k, 0, out=k)
    return np.repeat(_choice_ids(C, C1), k.ravel())


_CHOICE_IDS: dict[int, np.ndarray] = {}


def _choice_ids(C: int, C1: int) -> np.ndarray:
    """``np.tile(np.arange(C1), C)`` (read-only; a prefix of one cached array per C1)."""
    ids = _CHOICE_IDS.get(C1)
    if ids is None or ids.shape[0] < C * C1:
        ids = np.tile(np.arange(C1, dtype=np.int64), max(2 * C, 256))
        ids.flags.writeable = False
        _CHOICE_IDS[C1] = ids
    return ids[:C * C1]


def choose(logits: np.ndarray, mask: np.ndarray, inv: np.ndarray, mode: str,
           rng: np.random.Generator | None = None,
           rank: np.ndarray | None = None) -> np.ndarray:
    """Per-request choices (n,) from class ``logits`` (C, D + 1), the requests' ``mask``
    (n, D + 1, bool) and class of each request ``inv`` (n,); see the module docstring for
    ``mode``. Masks that differ inside a class are honoured (per-request masking). ``rank``
    (systematic mode; computed when None): each request's rank inside its class
    (:meth:`NumpySetScorer.last_ranks`)."""
    if mode not in CHOICE_MODES:
        raise ConfigError("mode", f"unknown mode {mode!r}", allowed=list(CHOICE_MODES))
    n = inv.shape[0]
    if bool((mask == mask[0]).all()):  # one mask for every request (the usual case): mask the classes
        lg = np.where(mask[0][None, :], logits, MASKED_LOGIT)
        req_of: np.ndarray | None = inv
    else:  # masks differ: mask per request
        lg = np.where(mask, logits[inv], MASKED_LOGIT)
        req_of = None
    if mode == "argmax":
        pick = lg.argmax(axis=1)
        return pick[req_of] if req_of is not None else pick
    if rng is None:
        raise ConfigError("rng", f"mode {mode!r} needs a numpy Generator")
    C1 = lg.shape[1]
    p = np.exp(lg - lg.max(axis=1, keepdims=True))
    cdf = np.cumsum(p, axis=1)
    cdf /= cdf[:, -1:]  # the last entry is exactly 1; masked entries add exactly 0
    rows_of = req_of if req_of is not None else np.arange(n)
    if mode == "sample":
        u = rng.random(n)
    else:  # systematic: one offset per class, members at (rank + offset) / size
        n_cls = int(inv.max()) + 1
        counts = np.bincount(inv, minlength=n_cls)
        if rank is None:
            order = np.argsort(inv, kind="stable")
            starts = np.cumsum(counts) - counts
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n) - np.repeat(starts, counts)
        u = (rank + rng.random(n_cls)[inv]) / counts[inv]
    # row r's CDF shifted by r: one sorted array; the choice is the count of entries <= u + r in row r
    cdf += np.arange(cdf.shape[0], dtype=np.float64)[:, None]
    u += rows_of
    pick = np.searchsorted(cdf.ravel(), u, "right") - rows_of * C1
    return np.minimum(pick, C1 - 1, out=pick)  # u + r rounding up to r + 1 (p ~ 1e-13)
