"""A set policy for the per-request action: one shared network scores every (request, datacenter) pair.

The network (:class:`SetNetwork`) reads the env's flat observation through its
:class:`~carbon_gym.env.ObservationLayout` and builds, for each pending-request slot k and
datacenter d, features of the request (prompt, predicted output, time waited), of the datacenter
(carbon now and forecast, PUE, queue, batch, free KV, power, the simulator's latency estimates,
up flag, carbon relative to the other datacenters) and of the pair (network delay k -> d and the
estimated TTFT headroom ``1 - (waited + network + queue wait + prefill) / T_ttft``). A small MLP
scores each pair; a second one gives each slot a learned *defer* score. The logits form a
``(K, D + 1)`` array, so the same weights serve any number of slots K and any topology size D
(and any number of regions or forecast hours: origin one-hots are not read — the per-pair
network delay carries the origin — and the forecast is summarised as next hour + mean).

With ``capacity_head=True`` (``[capacity] control = "agent"``) a per-datacenter head scores every
candidate number of powered servers n = 0..S_d of each datacenter d from its embedding and three
candidate inputs (n / S_d, n / S_d minus the share powered now, and the pending requests per
engine of n servers, / 16, capped at 10): a masked categorical per datacenter over at most
max_d S_d + 1 choices, again independent of the topology size. Every engine on a powered server
is kept awake (a sleeping engine saves nothing on this hardware: README, "Capacity control").

The critic pools the pair embeddings over valid pairs (mean) with the datacenter embeddings and
the time of day. Every slot-wise operation is shared and pooling is a mean, so permuting the
requests permutes the scores (equivariance) and leaves the value unchanged.

:class:`SetActorCriticPolicy` plugs the network into sb3-contrib's ``MaskablePPO`` (a subclass of
``MaskableActorCriticPolicy`` whose forward passes go through :class:`SetNetwork`), with
:class:`~train.slot_dist.SlotCategorical`, a vectorised masked categorical over the K slots.
With ``classes`` the PPO update and the rollouts run the network once per request class
(:meth:`SetNetwork.class_forward`) and the distribution works on the distinct (class, mask)
pairs, so the learner's cost, forward and backward, scales with classes, not requests.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from torch import nn

from carbon_gym.errors import ConfigError

from .slot_dist import MASKED_LOGIT, RouteCapacityDistribution, SlotCategorical

__all__ = [
    "dense_unique",
    "layout_spec",
    "SetNetwork",
    "SlotCategorical",
    "SetActorCriticPolicy",
    "MASKED_LOGIT",
    "N_DC_INPUTS",
    "N_SLOT_INPUTS",
    "N_PAIR_INPUTS",
    "N_DEMAND_INPUTS",
    "N_CAPACITY_INPUTS",
    "DEFAULT_CLASS_BINS",
    "class_bin_edges",
]

#: Forecast hours averaged into the "forecast mean" feature (at most the layout's H).
FORECAST_MEAN_HOURS = 6
#: Inputs of the datacenter encoder: 3 carbon (now, next hour, forecast mean) + 11 observed
#: + 3 effective-carbon (above the cleanest, z-score, carbon x PUE) + 1 load push + 2 time of day.
N_DC_INPUTS = 20
#: Inputs of the slot encoder: prompt, predicted output, waited.
N_SLOT_INPUTS = 3
#: Per-pair inputs: network delay, network minus the slot's best, TTFT headroom, queue+prefill part.
N_PAIR_INPUTS = 4
#: Extra datacenter inputs with ``demand_features``: pending prompt and predicted-output tokens
#: (of all valid slots) per engine of the datacenter.
N_DEMAND_INPUTS = 2

#: Inputs of the capacity head per (datacenter, candidate server count), besides the embedding.
N_CAPACITY_INPUTS = 3

#: Default request classes (``classes=True``), the facility MILP's own binning: origin x bins of
#: predicted output length (geometric, ratio 2) x bins of the TTFT time already used,
#: ``waited + prompt x mean prefill s/token`` (0.125 T_ttft = 0.25 s at T_ttft = 2 s).
DEFAULT_CLASS_BINS: dict[str, float] = {"output_ratio": 2.0, "used_bin": 0.125}
#: Output-length bin edges span ratio^-20 .. ratio^11 (observation units: tokens / 1024);
#: used-time bins 0 .. 63 x used_bin (the last bin is open-ended).
_OUT_EXP = (-20, 12)
_USED_BINS = 64


def class_bin_edges(bins: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """(output edges, used-time edges), float64, in observation units, for ``bins``
    (``output_ratio`` > 1, ``used_bin`` > 0): bin i of a value x is the number of edges <= x
    (``numpy.searchsorted(edges, x, "right")`` == ``torch.bucketize(x, edges, right=True)``: a
    value on an edge goes to the upper bin, as floor(log) in the facility MILP)."""
    ratio = float(bins.get("output_ratio", DEFAULT_CLASS_BINS["output_ratio"]))
    width = float(bins.get("used_bin", DEFAULT_CLASS_BINS["used_bin"]))
    if not ratio > 1.0:
        raise ConfigError("set_policy.classes.output_ratio", f"must be > 1, got {ratio}")
    if not width > 0.0:
        raise ConfigError("set_policy.classes.used_bin", f"must be > 0, got {width}")
    out_edges = ratio ** np.arange(_OUT_EXP[0], _OUT_EXP[1], dtype=np.float64)
    used_edges = width * np.arange(1, _USED_BINS, dtype=np.float64)
    return out_edges, used_edges


def _class_spec(classes: Any) -> dict[str, float] | None:
    if classes is None or classes is False:
        return None
    if classes is True:
        return dict(DEFAULT_CLASS_BINS)
    if isinstance(classes, Mapping):
        unknown = set(classes) - set(DEFAULT_CLASS_BINS)
        if unknown:
            raise ConfigError("set_policy.classes", f"unknown keys {sorted(unknown)}", allowed=sorted(DEFAULT_CLASS_BINS))
        out = {**DEFAULT_CLASS_BINS, **{k: float(v) for k, v in classes.items()}}
        class_bin_edges(out)
        return out
    raise ConfigError("set_policy.classes", f"expected true/false or a table of bins, got {classes!r}")


def layout_spec(layout: Any) -> dict[str, Any]:
    """The plain-data description of an observation layout that :class:`SetNetwork` needs.

    Args:
        layout: a :class:`~carbon_gym.env.ObservationLayout`, an env (wrapped or not) or a dict
            already produced by this function.

    Returns:
        dict with ``n_datacenters`` (D), ``max_pending`` (K), ``n_regions`` (R),
        ``forecast_hours`` (H), ``n_dc_features``, ``n_slot_features``, ``dc_columns``,
        ``slot_columns``, ``global_columns`` (name -> index) and ``n_engines`` (list, D).
    """
    if isinstance(layout, Mapping):
        return dict(layout)
    base = getattr(layout, "unwrapped", layout)
    lay = getattr(base, "layout", layout)
    for attr in ("n_datacenters", "max_pending", "dc_columns", "slot_columns"):
        if not hasattr(lay, attr):
            raise ConfigError("layout", f"expected an ObservationLayout or a GeoServeEnv, got {type(layout).__name__}")
    return {
        "n_datacenters": int(lay.n_datacenters),
        "max_pending": int(lay.max_pending),
        "n_regions": int(lay.n_regions),
        "forecast_hours": int(lay.forecast_hours),
        "n_dc_features": int(lay.n_dc_features),
        "n_slot_features": int(lay.n_slot_features),
        "dc_columns": {str(k): int(v) for k, v in lay.dc_columns.items()},
        "slot_columns": {str(k): int(v) for k, v in lay.slot_columns.items()},
        "global_columns": {str(k): int(v) for k, v in lay.global_columns.items()},
        "n_engines": [int(x) for x in np.asarray(lay.n_engines).reshape(-1)],
        **({"n_servers": [int(x) for x in np.asarray(lay.n_servers).reshape(-1)]}
           if getattr(lay, "n_servers", None) is not None else {}),
    }


def _mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def dense_unique(x: th.Tensor, size: int) -> tuple[th.Tensor, th.Tensor]:
    """``th.unique(x, return_inverse=True)`` of an int64 vector ``x`` whose values lie in
    ``[0, size)``, by a presence table instead of a sort (O(len(x) + size)): the distinct values in
    increasing order and, per element, the index of its value among them."""
    present = th.zeros(size, dtype=th.bool, device=x.device)
    present[x] = True
    rank = th.cumsum(present, 0) - 1
    return present.nonzero().squeeze(1), rank.index_select(0, x)


class SetNetwork(nn.Module):
    """Shared pair scorer + defer scorer + pooled critic (see the module docstring).

    Args:
        layout: :func:`layout_spec` of the env it first serves (rebind with :meth:`bind`).
        hidden: width of the encoders and of the pair layer.
        classes: score request *classes*, not single requests: ``True`` (the facility MILP's
            bins, :data:`DEFAULT_CLASS_BINS`) or a dict of bins. Requests of one class (same
            origin, output-length bin and used-TTFT bin) are scored on the class's mean slot
            features, so they share their scores exactly; inference then scores each class once
            (:class:`train.fast.NumpySetScorer`). ``None``/``False``: every request on its own.
        demand_features: add :data:`N_DEMAND_INPUTS` datacenter inputs (pending prompt and
            predicted-output tokens per engine) to the datacenter encoder.
        load_feedback: refinement passes (0 = none). Each pass computes the load the current
            choice distribution would send to every datacenter (expected requests, prompt and
            predicted-output tokens of all pending requests, per engine; datacenters that are
            down excluded) and adds a learned per-datacenter correction to every request's score
            for that datacenter (``fb_head`` of [datacenter embedding, that load]): a learned
            price per datacenter, as the capacity constraints' duals price them in the MILP, so
            that independent per-request choices respect the joint load.

    Parameters do not depend on the layout: ``state_dict`` of a network bound to one topology
    loads into a network bound to another.

    Attribute :attr:`per_slot` (default False): with ``classes``, evaluate the network on every
    slot (its class's rows) instead of once per class and gathering; the same logits and value
    to rounding, at a cost in slots. The reference of the class path (tests, ``train.bench_ppo``).
    """

    def __init__(self, layout: Any, hidden: int = 64, classes: Any = None, demand_features: bool = False,
                 load_feedback: int = 0, capacity_head: bool = False) -> None:
        super().__init__()
        if int(hidden) < 1:
            raise ConfigError("set_policy.hidden", f"must be a positive integer, got {hidden}")
        h = int(hidden)
        self.hidden = h
        self.classes = _class_spec(classes)
        self.demand_features = bool(demand_features)
        if int(load_feedback) < 0:
            raise ConfigError("set_policy.load_feedback", f"must be >= 0, got {load_feedback}")
        self.load_feedback = int(load_feedback)
        self.n_dc_inputs = N_DC_INPUTS + (N_DEMAND_INPUTS if self.demand_features else 0)
        if self.classes is not None:
            oe, ue = class_bin_edges(self.classes)
            self._out_edges, self._used_edges = th.as_tensor(oe), th.as_tensor(ue)
        self.dc_encoder = _mlp([self.n_dc_inputs, h, h])
        self.dc_context = nn.Linear(2 * h, h)  # [own embedding, mean over datacenters]
        self.slot_encoder = _mlp([N_SLOT_INPUTS, h, h])
        self.pair_from_dc = nn.Linear(h, h)
        self.pair_from_slot = nn.Linear(h, h, bias=False)
        self.pair_from_pair = nn.Linear(N_PAIR_INPUTS, h, bias=False)
        self.pair_out = nn.Linear(h, 1)
        self.defer_head = _mlp([2 * h, h, 1])  # [slot embedding, datacenter context]
        self.value_head = _mlp([2 * h + 2, h, 1])  # [pooled pairs, pooled datacenters, hour]
        if self.load_feedback:
            self.fb_head = _mlp([h + 3, h, 1])  # [datacenter embedding, proposed load x 3] -> score correction
        self.per_slot = False
        #: Multiplies every per-step request count the network reads (the pending load and demand
        #: of :meth:`totals`, the load-feedback weights): the training polling period over the
        #: env's, so that a network trained at one period reads a step of another as the requests
        #: of its own period (1.0: as trained; set by :class:`train.policy.LearnedPolicy`).
        self.count_scale = 1.0
        self.capacity_head = bool(capacity_head)
        if self.capacity_head:
            self.cap_head = _mlp([h + N_CAPACITY_INPUTS, h, 1])  # [datacenter embedding, candidate] -> score
        self.bind(layout)

    # ------------------------------------------------------------------ layout
    def bind(self, layout: Any) -> SetNetwork:
        """Read observations of another layout from now on (weights unchanged)."""
        spec = layout_spec(layout)
        self.spec = spec
        self.D = int(spec["n_datacenters"])
        self.K = int(spec["max_pending"])
        self.F_D = int(spec["n_dc_features"])
        self.F_S = int(spec["n_slot_features"])
        H = int(spec["forecast_hours"])
        c = spec["dc_columns"]
        s = spec["slot_columns"]
        g = spec["global_columns"]
        self._c_now = c["carbon_now"]
        self._c_f1 = c["carbon_forecast_1h"] if H >= 1 else c["carbon_now"]
        self._c_fmean = slice(c["carbon_now"] + 1, c["carbon_now"] + 1 + min(H, FORECAST_MEAN_HOURS)) if H >= 1 else None
        self._c_obs = [c[n] for n in ("pue", "queue_len", "running", "free_kv", "power", "busy_engines",
                                      "est_queue_wait", "est_prefill", "est_tpot", "tpot_slope", "up")]
        self._c_pue, self._c_up = c["pue"], c["up"]
        self._c_wait, self._c_prefill = c["est_queue_wait"], c["est_prefill"]
        self._s_valid, self._s_prompt = s["valid"], s["prompt"]
        self._s_pred, self._s_waited = s["predicted_output"], s["waited"]
        self._s_net = s["network"]
        self._s_origin, self._R = s["origin"], int(spec["n_regions"])
        cols = [self._s_prompt, self._s_pred, self._s_waited] + list(range(self._s_net, self._s_net + self.D))
        contiguous = cols == list(range(cols[0], cols[0] + len(cols)))
        self._cls_cols: slice | th.Tensor = slice(cols[0], cols[0] + len(cols)) if contiguous else th.as_tensor(cols)
        self._g_sin, self._g_cos = g["hour_sin"], g["hour_cos"]
        engines = np.maximum(np.asarray(spec["n_engines"], dtype=np.float32), 1.0)
        self._inv_engines = th.as_tensor(1.0 / (engines * 16.0))  # not a parameter: layout-bound
        self._c_srv = c.get("servers_on")
        srv = spec.get("n_servers")
        self.n_servers = None if srv is None else np.maximum(np.asarray(srv, dtype=np.int64), 1)
        if self.n_servers is not None:
            self.engines_per_node = np.maximum(np.asarray(spec["n_engines"], dtype=np.int64) // self.n_servers, 1)
        return self

    def capacity_ready(self) -> bool:
        """Whether the bound layout has what the capacity head reads (servers per datacenter and
        the ``servers_on`` column: ``[capacity] control`` other than ``always_on``)."""
        return self.capacity_head and self.n_servers is not None and self._c_srv is not None

    def capacity_candidates(self, dc: th.Tensor, totals: th.Tensor, n_servers: Any = None,
                            n_engines: Any = None) -> tuple[th.Tensor, th.Tensor]:
        """Candidate inputs (B, D, S + 1, 3) of every server count n = 0..S (S = max_d S_d) and
        their mask (D, S + 1) (n <= S_d); ``n_servers`` / ``n_engines`` (D,): another topology's
        than the bound one (training on recorded steps)."""
        if not self.capacity_ready() and n_servers is None:
            raise ConfigError("capacity_head", "the capacity head needs an env with capacity control "
                              "([capacity] control = 'agent'): servers per datacenter and the servers_on column")
        if n_servers is None:
            assert self.n_servers is not None
            srv, k = self.n_servers, self.engines_per_node
        else:
            srv = np.maximum(np.asarray(n_servers, dtype=np.int64), 1)
            k = np.maximum(np.asarray(n_engines, dtype=np.int64) // srv, 1)
        S = int(srv.max())
        n = th.arange(S + 1, dtype=dc.dtype, device=dc.device)
        s_d = th.as_tensor(srv, dtype=dc.dtype, device=dc.device)
        k_d = th.as_tensor(k, dtype=dc.dtype, device=dc.device)
        frac = n.view(1, 1, -1) / s_d.view(1, -1, 1)  # (1, D, S + 1)
        now = dc[:, :, self._c_srv].unsqueeze(-1)  # (B, D, 1): share of servers powered now
        per_engine = totals[:, 0].view(-1, 1, 1) / (16.0 * (n.view(1, 1, -1) * k_d.view(1, -1, 1)).clamp(min=0.5))
        B = dc.shape[0]
        x = th.stack([frac.expand(B, -1, -1), frac - now, per_engine.clamp(max=10.0).expand(B, -1, -1)], dim=-1)
        mask = n.view(1, -1) <= s_d.view(-1, 1)
        return x, mask

    def capacity_scores(self, dc: th.Tensor, gl: th.Tensor, totals: th.Tensor, n_servers: Any = None,
                        n_engines: Any = None) -> th.Tensor:
        """Logits (B, D, S + 1) of the powered-server count of every datacenter (masked beyond
        S_d) for datacenter rows ``dc`` (B, D, F_D), globals ``gl`` and :meth:`totals` ``totals``
        (B, 3); ``n_servers`` / ``n_engines`` as for :meth:`capacity_candidates`."""
        dt = self.pair_out.weight.dtype
        dc, gl, totals = dc.to(dt), gl.to(dt), totals.to(dt)
        dc_in, _, _ = self.dc_inputs(dc, gl, totals)
        e = self._dc_embed(dc_in)  # (B, D, h)
        x, mask = self.capacity_candidates(dc, totals, n_servers, n_engines)
        S1 = x.shape[2]
        z = self.cap_head(th.cat([e.unsqueeze(2).expand(-1, -1, S1, -1), x], dim=-1)).squeeze(-1)
        return z.masked_fill(~mask.unsqueeze(0), MASKED_LOGIT)

    def observation_capacity_scores(self, obs: Mapping[str, th.Tensor]) -> th.Tensor:
        """:meth:`capacity_scores` (B, D, S + 1) of observations (the env's Dict, batched)."""
        dc, sl, gl = self.split_obs(obs)
        return self.capacity_scores(dc, gl, self.totals(sl, sl[:, :, self._s_valid] > 0.5))

    def _dc_embed(self, dc_in: th.Tensor) -> th.Tensor:
        """Datacenter embeddings (B, D, h) with the fleet context."""
        e = self.dc_encoder(dc_in)
        ctx = e.mean(dim=1, keepdim=True)
        return th.relu(self.dc_context(th.cat([e, ctx.expand_as(e)], dim=-1)))

    # ------------------------------------------------------------------ features
    def split_obs(self, obs: Mapping[str, th.Tensor]) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """The observation as datacenter rows (B, D, F_D), slot rows (B, K', F_S) (K' may be
        trimmed to the filled slots) and globals (B, F_G), in the dtype of the weights."""
        dt = self.pair_out.weight.dtype
        dc = obs["datacenters"].to(dt).reshape(-1, self.D, self.F_D)
        sl = obs["slots"].to(dt).reshape(dc.shape[0], -1, self.F_S)
        gl = obs["globals"].to(dt).reshape(dc.shape[0], -1)
        return dc, sl, gl

    def totals(self, sl: th.Tensor, valid: th.Tensor) -> th.Tensor:
        """Per observation (B, 3): valid slots, their prompt and predicted-output sums (obs units),
        times :attr:`count_scale`."""
        w = valid.to(sl.dtype)
        t = th.stack([w.sum(dim=1), (sl[:, :, self._s_prompt] * w).sum(dim=1), (sl[:, :, self._s_pred] * w).sum(dim=1)], dim=1)
        return t if self.count_scale == 1.0 else t * self.count_scale

    def class_keys(self, sl: th.Tensor, valid: th.Tensor, dc: th.Tensor) -> th.Tensor:
        """Class key of every slot (B, K) (int64; -1 on invalid slots): origin x output-length bin x
        bin of ``waited + prompt x mean est. prefill`` over up datacenters, computed in float64
        (the same arithmetic as :class:`train.fast.NumpySetScorer`)."""
        assert self.classes is not None
        origin = sl[:, :, self._s_origin:self._s_origin + self._R].argmax(dim=-1)  # a one-hot: any dtype
        ob = th.bucketize(sl[:, :, self._s_pred].double(), self._out_edges, right=True)
        up = (dc[:, :, self._c_up] > 0.5).double()
        pref = (dc[:, :, self._c_prefill].double() * up).sum(dim=1) / up.sum(dim=1).clamp(min=1.0)
        used = sl[:, :, self._s_waited].double() + sl[:, :, self._s_prompt].double() * pref.unsqueeze(1)
        hb = th.bucketize(used, self._used_edges, right=True)
        key = (origin * (len(self._out_edges) + 1) + ob) * _USED_BINS + hb
        return th.where(valid, key, th.full_like(key, -1))

    def _class_groups(self, sl: th.Tensor, valid: th.Tensor, dc: th.Tensor) -> tuple[th.Tensor, ...]:
        """Classes of a batch: sorted group ids (N,) (row b's groups are ``span * b + key + 1``;
        group 0 of a row holds its invalid slots), the group of every slot (B * K,), the
        class-mean columns (N, n_cols) over the valid members in float64 (0 for the invalid
        slots' groups), the valid members per group (N,), and the flat positions of the valid
        slots (V,). The class columns are those classes share (:meth:`_class_cols`)."""
        B, K, F = sl.shape
        key = self.class_keys(sl, valid, dc)
        gk = (key + 1) + self._class_span() * th.arange(B, device=sl.device).unsqueeze(1)
        uniq, inv = dense_unique(gk.reshape(-1), self._class_span() * B)
        vpos = valid.reshape(-1).nonzero().squeeze(1)
        inv_v = inv.index_select(0, vpos)
        vals = self._class_cols(sl.reshape(B * K, F).index_select(0, vpos)).double()
        n_cls = int(uniq.numel())
        sums = th.zeros(n_cls, vals.shape[1], dtype=th.float64, device=sl.device).index_add_(0, inv_v, vals)
        cnt = th.bincount(inv_v, minlength=n_cls)
        mean = sums / cnt.to(th.float64).clamp(min=1.0).unsqueeze(1)
        return uniq, inv, mean, cnt, vpos

    def _class_cols(self, rows: th.Tensor, values: th.Tensor | None = None) -> th.Tensor:
        """The columns classes share (prompt, predicted output, waited, network) of ``rows``
        (N, F_S), or, with ``values`` (N, n_cols), ``rows`` with those columns replaced (in place)."""
        cols = self._cls_cols
        if values is None:
            return rows[:, cols] if isinstance(cols, slice) else rows.index_select(1, cols.to(rows.device))
        rows[:, cols] = values
        return rows

    def _class_span(self) -> int:
        """Group ids per observation row (every class key + 1, and 0 for the invalid slots)."""
        return int(self._R * (len(self._out_edges) + 1) * _USED_BINS) + 1

    def class_mean_slots(self, sl: th.Tensor, valid: th.Tensor, dc: th.Tensor) -> th.Tensor:
        """``sl`` with each valid slot's prompt, predicted output, waited and network columns
        replaced by the mean over its class (same observation, same :meth:`class_keys`)."""
        B, K, F = sl.shape
        _, inv, mean, _, vpos = self._class_groups(sl, valid, dc)
        out = sl.reshape(B * K, F).clone()
        out[vpos] = self._class_cols(out[vpos], mean[inv.index_select(0, vpos)].to(sl.dtype))
        return out.reshape(B, K, F)

    def class_rows(self, sl: th.Tensor, valid: th.Tensor, dc: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """The batch's classes, padded per observation: rows (B, C, F_S) (C = most classes of one
        observation, with its invalid slots as one more row), the valid requests per row (B, C)
        (0 for the invalid slots' row and for padding) and the row of every slot (B, K) (int64).

        Row c of observation b is the first member's slot row with the class-mean columns of
        :meth:`class_mean_slots`, so ``rows.gather(1, slot_class)`` equals ``class_mean_slots``
        on the valid slots (the invalid slots' row is their first one: the env writes them all
        zero)."""
        B, K, F = sl.shape
        uniq, inv, mean, cnt, _ = self._class_groups(sl, valid, dc)
        n_cls = int(uniq.numel())
        b_of = th.div(uniq, self._class_span(), rounding_mode="floor")
        n_b = th.bincount(b_of, minlength=B)
        local = th.arange(n_cls, device=sl.device) - (th.cumsum(n_b, 0) - n_b)[b_of]
        C = int(n_b.max()) if n_cls else 1
        pos = th.arange(B * K, device=sl.device)
        rep = th.full((n_cls,), B * K, dtype=pos.dtype, device=sl.device).scatter_reduce_(0, inv, pos, reduce="amin")
        crow = sl.reshape(B * K, F).index_select(0, rep)
        is_cls = cnt > 0  # not the invalid slots' group
        crow = self._class_cols(crow, th.where(is_cls.unsqueeze(1), mean.to(sl.dtype), self._class_cols(crow)))
        rows = sl.new_zeros(B, C, F)
        rows[b_of, local] = crow
        sizes = sl.new_zeros(B, C)
        sizes[b_of, local] = cnt.to(sl.dtype)
        return rows, sizes, local[inv].reshape(B, K)

    def dc_inputs(self, dc: th.Tensor, gl: th.Tensor, totals: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """Datacenter-encoder inputs (B, D, n_dc_inputs), the up flags (B, D) and the hour (B, 2)."""
        B = dc.shape[0]
        up = dc[:, :, self._c_up] > 0.5
        carbon = dc[:, :, self._c_now]
        eff = carbon * dc[:, :, self._c_pue]
        big = th.full_like(eff, 1e3)
        eff_min = th.where(up, eff, big).min(dim=1, keepdim=True).values
        n_up = up.to(eff.dtype).sum(dim=1, keepdim=True).clamp(min=1.0)
        eff_mean = (eff * up).sum(dim=1, keepdim=True) / n_up
        eff_std = (((eff - eff_mean) ** 2) * up).sum(dim=1, keepdim=True).div(n_up).sqrt()
        fmean = dc[:, :, self._c_fmean].mean(dim=2) if self._c_fmean is not None else carbon
        inv_eng = self._inv_engines.to(device=dc.device, dtype=dc.dtype)
        hour = th.stack([gl[:, self._g_sin], gl[:, self._g_cos]], dim=1)  # (B, 2)
        parts = [
            carbon.unsqueeze(-1),
            dc[:, :, self._c_f1].unsqueeze(-1),
            fmean.unsqueeze(-1),
            dc[:, :, self._c_obs],
            (eff - eff_min).clamp(min=0.0).unsqueeze(-1),
            ((eff - eff_mean) / (eff_std + 1e-3)).clamp(-5.0, 5.0).unsqueeze(-1),
            eff.unsqueeze(-1),
            (totals[:, 0:1] * inv_eng).unsqueeze(-1),
            hour.unsqueeze(1).expand(B, self.D, 2),
        ]
        if self.demand_features:
            parts.append((totals[:, 1:2] * inv_eng).unsqueeze(-1))
            parts.append((totals[:, 2:3] * inv_eng).unsqueeze(-1))
        return th.cat(parts, dim=-1), up, hour

    def slot_pair_inputs(self, sl: th.Tensor, dc: th.Tensor, up: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Slot-encoder inputs (B, K, 3) and pair inputs (B, K, D, 4)."""
        prompt = sl[:, :, self._s_prompt]
        waited = sl[:, :, self._s_waited]
        slot_in = th.stack([prompt, sl[:, :, self._s_pred], waited], dim=-1)
        net = sl[:, :, self._s_net:self._s_net + self.D]  # (B, K, D), / T_ttft
        net_best = th.where(up.unsqueeze(1), net, th.full_like(net, 1e3)).min(dim=2, keepdim=True).values
        server = dc[:, :, self._c_wait].unsqueeze(1) + dc[:, :, self._c_prefill].unsqueeze(1) * prompt.unsqueeze(-1)
        headroom = 1.0 - (waited.unsqueeze(-1) + net + server)
        pair_in = th.stack([net, (net - net_best).clamp(min=0.0, max=10.0), headroom.clamp(-10.0, 2.0), server.clamp(max=10.0)], dim=-1)
        return slot_in, pair_in

    def features(self, obs: Mapping[str, th.Tensor]) -> tuple[th.Tensor, th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        """Per-datacenter (B, D, n_dc_inputs), per-slot (B, K, 3), per-pair (B, K, D, 4) inputs,
        the valid-slot mask (B, K) and the hour (B, 2). With ``classes``, a slot's inputs are
        its class's (:meth:`class_mean_slots`)."""
        dc, sl, gl = self.split_obs(obs)
        valid = sl[:, :, self._s_valid] > 0.5
        totals = self.totals(sl, valid)
        if self.classes is not None:
            sl = self.class_mean_slots(sl, valid, dc)
        dc_in, up, hour = self.dc_inputs(dc, gl, totals)
        slot_in, pair_in = self.slot_pair_inputs(sl, dc, up)
        return dc_in, slot_in, pair_in, valid, hour

    def class_scores(self, dc: th.Tensor, gl: th.Tensor, cls_slots: th.Tensor, totals: th.Tensor,
                     sizes: th.Tensor | None = None) -> th.Tensor:
        """Logits (B, C, D + 1) of C precomputed class rows (B, C, F_S) (class-mean slot rows, as
        :meth:`class_mean_slots` gives) of observations whose datacenter rows, globals and
        :meth:`totals` are ``dc`` (B, D, F_D), ``gl`` (B, F_G), ``totals`` (B, 3); ``sizes``
        (B, C): requests per class (0 on padding; needed with ``load_feedback``): the class-level
        behaviour-cloning path (:mod:`train.imitate`)."""
        dt = self.pair_out.weight.dtype
        dc_in, up, _ = self.dc_inputs(dc.to(dt), gl.to(dt), totals.to(dt))
        slot_in, pair_in = self.slot_pair_inputs(cls_slots.to(dt), dc.to(dt), up)
        return self._heads(dc_in, slot_in, pair_in, sizes, up)[0]

    def _heads(self, dc_in: th.Tensor, slot_in: th.Tensor, pair_in: th.Tensor, weights: th.Tensor | None = None,
               up: th.Tensor | None = None, pool: bool = False) -> tuple[th.Tensor, th.Tensor | None, th.Tensor]:
        """Logits (B, R, D + 1) of R rows (slots or classes), with ``pool`` the pair embeddings'
        mean over the rows' requests (B, h) (else None), and the datacenter embeddings (B, D, h).
        ``weights`` (B, R): requests each row stands for (valid flag, or class size; needed with
        ``load_feedback`` and ``pool``); ``up`` (B, D): needed with ``load_feedback``."""
        e = self._dc_embed(dc_in)
        s = self.slot_encoder(slot_in)
        pair = th.relu(self.pair_from_pair(pair_in) + self.pair_from_dc(e).unsqueeze(1) + self.pair_from_slot(s).unsqueeze(2))
        scores = self.pair_out(pair).squeeze(-1)
        ctx_k = e.mean(dim=1, keepdim=True).expand(-1, s.shape[1], -1)
        defer = self.defer_head(th.cat([s, ctx_k], dim=-1))
        if self.load_feedback:
            scores = self._feedback(scores, defer, e, slot_in, weights, up)
        pooled = None
        if pool:
            if weights is None:
                raise ConfigError("weights", "pooling the pair embeddings needs the rows' weights")
            w = weights.to(pair.dtype)
            n = w.sum(dim=1).clamp(min=1.0)  # (B,) valid requests
            pooled = (pair.mean(dim=2) * w.unsqueeze(-1)).sum(dim=1) / n.unsqueeze(-1)
        return th.cat([scores, defer], dim=-1), pooled, e

    def _feedback(self, scores: th.Tensor, defer: th.Tensor, e: th.Tensor, slot_in: th.Tensor, weights: Any, up: Any) -> th.Tensor:
        if weights is None or up is None:
            raise ConfigError("load_feedback", "needs the rows' weights and the up flags")
        w = weights.to(scores.dtype).unsqueeze(-1)  # (B, K, 1)
        if self.count_scale != 1.0:
            w = w * self.count_scale
        inv_eng = self._inv_engines.to(device=scores.device, dtype=scores.dtype)
        down = ~up.unsqueeze(1)  # (B, 1, D)
        load_w = th.stack([th.ones_like(slot_in[:, :, 0]), slot_in[:, :, 0], slot_in[:, :, 1]], dim=-1) * w  # (B, K, 3)
        for _ in range(self.load_feedback):
            lg = th.cat([scores.masked_fill(down, MASKED_LOGIT), defer], dim=-1)
            p = th.softmax(lg, dim=-1)[:, :, :-1]  # (B, K, D)
            load = th.einsum("bkd,bkj->bdj", p, load_w) * inv_eng.view(1, -1, 1)  # (B, D, 3)
            corr = self.fb_head(th.cat([e, load], dim=-1)).squeeze(-1)  # (B, D)
            scores = scores + corr.unsqueeze(1)
        return scores

    # ------------------------------------------------------------------ forward
    def class_forward(self, obs: Mapping[str, th.Tensor], value: bool = True) -> tuple[th.Tensor, th.Tensor | None, th.Tensor | None]:
        """Logits of the network's rows, the critic's value (B, 1) (None unless ``value``) and
        the row of every slot (B, K) (int64).

        With ``classes`` (and not :attr:`per_slot`) the network runs once per class
        (:meth:`class_rows`): the logits are (B, C, D + 1), C the most classes of an observation
        in the batch, and slot k's are row ``slot_class[b, k]``; the same logits and value as
        the per-slot evaluation (which scores every slot on its class's rows) to rounding, at a
        cost, forward and backward, in classes. Otherwise the logits are per slot (B, K, D + 1)
        and the row index is None."""
        dc, sl, gl = self.split_obs(obs)
        valid = sl[:, :, self._s_valid] > 0.5
        totals = self.totals(sl, valid)
        dc_in, up, hour = self.dc_inputs(dc, gl, totals)
        slot_class = None
        if self.classes is not None and not self.per_slot:
            rows, weights, slot_class = self.class_rows(sl, valid, dc)
        else:
            rows = self.class_mean_slots(sl, valid, dc) if self.classes is not None else sl
            weights = valid.to(sl.dtype)
        slot_in, pair_in = self.slot_pair_inputs(rows, dc, up)
        logits, pooled, e = self._heads(dc_in, slot_in, pair_in, weights, up, pool=value)
        v = None
        if value:
            assert pooled is not None
            v = self.value_head(th.cat([pooled, e.mean(dim=1), hour], dim=-1))
        return logits, v, slot_class

    @staticmethod
    def slot_logits(logits: th.Tensor, slot_class: th.Tensor | None) -> th.Tensor:
        """Per-slot logits (B, K, D + 1) of :meth:`class_forward`'s rows."""
        if slot_class is None:
            return logits
        return logits.gather(1, slot_class.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))

    def scores(self, obs: Mapping[str, th.Tensor]) -> th.Tensor:
        """Logits (B, K, D + 1) only (no critic): the torch inference path of
        :class:`~train.policy.LearnedPolicy` (``backend="torch"``). Equal to ``forward(obs)[0]``."""
        logits, _, slot_class = self.class_forward(obs, value=False)
        return self.slot_logits(logits, slot_class)

    def forward(self, obs: Mapping[str, th.Tensor]) -> tuple[th.Tensor, th.Tensor]:
        """Return (logits (B, K, D + 1), value (B, 1)); masking is left to the distribution."""
        logits, value, slot_class = self.class_forward(obs)
        assert value is not None
        return self.slot_logits(logits, slot_class), value


class SetActorCriticPolicy(MaskableActorCriticPolicy):
    """``MaskableActorCriticPolicy`` whose actor and critic are one :class:`SetNetwork`.

    Extra keyword arguments (``policy_kwargs`` of ``MaskablePPO``): ``layout`` (required,
    :func:`layout_spec` of the training env), ``hidden`` (64), ``logprob_reduction``
    (``"mean"`` or ``"sum"``, see :class:`SlotCategorical`), ``classes``, ``demand_features``,
    ``load_feedback`` and ``capacity_head`` (see :class:`SetNetwork`). The observation goes to
    the network unflattened; ``net_arch``/``activation_fn`` are ignored.

    The action space is the per-request ``MultiDiscrete([D + 1] * K)``, or with
    ``capacity_head`` the flattened capacity action of
    :class:`~carbon_gym.wrappers.FlattenCapacityAction` (route K | capacity D | servers D, for
    an env with ``capacity.control = "agent"``), whose distribution is
    :class:`~train.slot_dist.RouteCapacityDistribution` (the head's servers per datacenter).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Any,
        *args: Any,
        layout: Mapping[str, Any] | None = None,
        hidden: int = 64,
        logprob_reduction: str = "mean",
        classes: Any = None,
        demand_features: bool = False,
        load_feedback: int = 0,
        capacity_head: bool = False,
        **kwargs: Any,
    ) -> None:
        if layout is None:
            raise ConfigError("policy_kwargs.layout", "SetActorCriticPolicy needs the env's layout (train.set_policy.layout_spec(env))")
        self._layout = layout_spec(layout)
        self._capacity = bool(capacity_head)
        K, D = int(self._layout["max_pending"]), int(self._layout["n_datacenters"])
        want = [D + 1] * K
        if self._capacity:
            if "n_servers" not in self._layout:
                raise ConfigError("capacity_head", "the capacity head needs an env with capacity control "
                                  "([capacity] control = 'agent')")
            want += [int(x) + 1 for x in self._layout["n_engines"]] + [int(x) + 1 for x in self._layout["n_servers"]]
        if not isinstance(action_space, spaces.MultiDiscrete) or action_space.nvec.tolist() != want:
            what = ("the flattened capacity action (train.envs.ScenarioMixEnv, carbon_gym.wrappers.FlattenCapacityAction)"
                    if self._capacity else "the per-request MultiDiscrete([D + 1] * K) action")
            raise ConfigError("action_space", f"the set policy needs {what} of its layout (K = {K}, D = {D})")
        self._hidden = int(hidden)
        self._reduction = str(logprob_reduction)
        self._classes = _class_spec(classes)
        self._demand = bool(demand_features)
        self._feedback_passes = int(load_feedback)
        kwargs.pop("net_arch", None)
        kwargs["ortho_init"] = False
        super().__init__(observation_space, action_space, lr_schedule, *args, net_arch=[], **kwargs)
        route = SlotCategorical(K, D + 1, self._reduction)
        self.action_dist: SlotCategorical | RouteCapacityDistribution = (
            RouteCapacityDistribution(route, self._layout["n_engines"], self._layout["n_servers"]) if self._capacity else route)

    def _build(self, lr_schedule: Any) -> None:
        self.net = SetNetwork(self._layout, hidden=self._hidden, classes=self._classes, demand_features=self._demand,
                              load_feedback=self._feedback_passes, capacity_head=self._capacity)
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(layout=self._layout, hidden=self._hidden, logprob_reduction=self._reduction)
        if self._classes is not None or self._demand:  # older checkpoints: neither key, same network
            data.update(classes=self._classes, demand_features=self._demand,
                              load_feedback=self._feedback_passes)
        if self._capacity:
            data.update(capacity_head=True)
        data.pop("net_arch", None)
        return data

    def _obs(self, obs: Any) -> dict[str, th.Tensor]:
        if not isinstance(obs, Mapping):
            raise ConfigError("observation", "the set policy reads the env's Dict observation")
        return {k: v.float() for k, v in obs.items()}

    def _dist(self, obs: Any, action_masks: Any, value: bool = True) -> tuple[Any, th.Tensor | None]:
        """The masked distribution of ``obs`` (class mode with a class network; with the
        capacity head, the flattened capacity action's) and the value."""
        o = self._obs(obs)
        logits, values, slot_class = self.net.class_forward(o, value=value)
        if isinstance(self.action_dist, RouteCapacityDistribution):
            dist: Any = self.action_dist.proba_distribution(logits, slot_class, self.net.observation_capacity_scores(o))
        else:
            dist = self.action_dist.proba_distribution(logits, slot_class)
        if action_masks is not None:
            dist.apply_masking(action_masks)
        return dist, values

    def forward(self, obs: Any, deterministic: bool = False, action_masks: Any = None) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        dist, values = self._dist(obs, action_masks)
        assert values is not None
        actions = dist.get_actions(deterministic=deterministic)
        return actions, values, dist.log_prob(actions)

    def evaluate_actions(self, obs: Any, actions: th.Tensor, action_masks: Any = None) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        dist, values = self._dist(obs, action_masks)
        assert values is not None
        return values, dist.log_prob(actions), dist.entropy()

    def get_distribution(self, obs: Any, action_masks: Any = None) -> Any:
        return self._dist(obs, action_masks, value=False)[0]

    def predict_values(self, obs: Any) -> th.Tensor:
        values = self.net.class_forward(self._obs(obs))[1]
        assert values is not None
        return values

    def _predict(self, observation: Any, deterministic: bool = False, action_masks: Any = None) -> th.Tensor:
        return self.get_distribution(observation, action_masks).get_actions(deterministic=deterministic)
