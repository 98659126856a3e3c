"""The set policy's action distribution: K masked categoricals, vectorised, optionally per class.

:class:`SlotCategorical` holds K independent masked categoricals over A choices (the per-request
action: A = D + 1, datacenters then *defer*) as one tensor (sb3-contrib's
``MaskableMultiCategoricalDistribution`` builds one Python object per slot, too slow for the
thousands of slots a paper-scale step holds).

**Class mode** (``proba_distribution(class_logits, slot_class)``): the class set policy scores
each request class once (:meth:`train.set_policy.SetNetwork.class_forward`), so the logits come
as C rows per observation and the class row of every slot. Slots of one class share their
logits but not always their masks (a datacenter whose engines cannot hold a long prompt is
masked for that request only), so the distribution works on the distinct (class, mask) pairs of
the batch, U of them (U ~ C << K): each pair's log-softmax and entropy are computed once, and a
slot reads its action's log-probability and its entropy from its pair. The result equals the
per-slot computation on gathered logits to rounding, at a cost in pairs plus O(K) integer work
(the mask codes and one sort), forward and backward.
"""

from __future__ import annotations

from typing import Any

import torch as th
from sb3_contrib.common.maskable.distributions import MaskableDistribution
from torch import nn

from carbon_gym.errors import ConfigError

__all__ = ["MASKED_LOGIT", "SlotCategorical", "RouteCapacityDistribution", "awake_engines"]

#: Masked logits are set to this (probability ~0).
MASKED_LOGIT = -1e8


class SlotCategorical(MaskableDistribution):
    """Independent masked categoricals over K slots with A choices each, vectorised.

    ``log_prob`` and ``entropy`` are summed over slots (``reduction="sum"``, the exact joint
    log-probability) or averaged over the slots that hold a request (``"mean"``: the PPO ratio
    becomes a per-request geometric mean, which keeps the clipped objective usable when a step
    holds a thousand requests; the gradient is scaled by 1 / pending requests). A slot with a
    single allowed choice (padding: *defer* only) carries no decision and is left out of the
    mean. See the module docstring for the class mode.
    """

    def __init__(self, n_slots: int, n_choices: int, reduction: str = "sum") -> None:
        super().__init__()
        if reduction not in ("sum", "mean"):
            raise ConfigError("set_policy.logprob_reduction", f"got {reduction!r}", allowed=["sum", "mean"])
        self.n_slots, self.n_choices, self.reduction = int(n_slots), int(n_choices), reduction
        self._raw: th.Tensor | None = None  # (B, K, A) per slot, or (B, C, A) per class
        self._slot_class: th.Tensor | None = None  # (B, K) class row of every slot (class mode)
        self._masks: th.Tensor | None = None  # (B, K, A) bool
        self._state: tuple[th.Tensor, th.Tensor | None, th.Tensor | None] | None = None

    def proba_distribution_net(self, *args: Any, **kwargs: Any) -> nn.Module:
        """Unused: the logits come from :class:`~train.set_policy.SetNetwork`."""
        return nn.Identity()

    def proba_distribution(self, action_logits: th.Tensor, slot_class: th.Tensor | None = None) -> SlotCategorical:
        """Per-slot logits (B, K x A), or with ``slot_class`` (B, K) class logits (B, C, A)."""
        if slot_class is None:
            self._raw = action_logits.reshape(-1, self.n_slots, self.n_choices)
        else:
            self._raw = action_logits.reshape(slot_class.shape[0], -1, self.n_choices)
        self._slot_class = slot_class
        self._masks = None
        self._state = None
        return self

    def apply_masking(self, masks: Any) -> None:
        """Allowed choices (B, K x A) bool; None removes the masking."""
        assert self._raw is not None, "call proba_distribution first"
        self._masks = None if masks is None else (
            th.as_tensor(masks, device=self._raw.device).reshape(-1, self.n_slots, self.n_choices).bool())
        self._state = None

    # ------------------------------------------------------------------ rows
    def _rows(self) -> tuple[th.Tensor, th.Tensor | None, th.Tensor | None]:
        """(log-probabilities of the distinct rows (R, A), the row of every slot (B, K) or None
        when rows are slots (B, K, A), decision weights (B, K) or None when unmasked)."""
        if self._state is None:
            assert self._raw is not None, "call proba_distribution first"
            raw, m, A = self._raw, self._masks, self.n_choices
            if self._slot_class is not None:
                B, C = raw.shape[0], raw.shape[1]
                g = self._slot_class + C * th.arange(B, device=raw.device).unsqueeze(1)  # (B, K) global class
                if m is None:
                    self._state = (th.log_softmax(raw.reshape(B * C, A), dim=-1), g, None)
                    return self._state
                if (B * C).bit_length() + A <= 62:  # (class, mask) pairs as one int64 key
                    code = (m.to(th.int64) * (1 << th.arange(A, device=raw.device))).sum(dim=-1)
                    uniq, inv = th.unique((g << A) + code, return_inverse=True)
                    pos = th.arange(inv.numel(), device=raw.device)
                    rep = th.full((uniq.numel(),), inv.numel(), dtype=pos.dtype, device=raw.device).scatter_reduce_(
                        0, inv.reshape(-1), pos, reduce="amin")
                    m_u = m.reshape(-1, A)[rep]
                    raw_u = raw.reshape(B * C, A)[th.div(uniq, 1 << A, rounding_mode="floor")]
                    logp = th.log_softmax(th.where(m_u, raw_u, th.full_like(raw_u, MASKED_LOGIT)), dim=-1)
                    w = (m_u.sum(dim=-1) > 1).to(raw.dtype)[inv]
                    self._state = (logp, inv.reshape(B, -1), w.reshape(B, -1))
                    return self._state
                raw = raw.reshape(B * C, A)[g]  # too many choices for the key: per slot
            if m is None:
                self._state = (th.log_softmax(raw, dim=-1), None, None)
            else:
                lg = th.log_softmax(th.where(m, raw, th.full_like(raw, MASKED_LOGIT)), dim=-1)
                self._state = (lg, None, (m.sum(dim=-1) > 1).to(raw.dtype))
        return self._state

    @property
    def logits(self) -> th.Tensor:
        """Per-slot log-probabilities (B, K, A) (masked choices at ~ -1e8)."""
        logp, row, _ = self._rows()
        return logp if row is None else logp[row]

    def _reduce(self, per_slot: th.Tensor) -> th.Tensor:
        if self.reduction == "sum":
            return per_slot.sum(dim=-1)
        w = self._rows()[2]
        if w is None:
            w = th.ones_like(per_slot)
        return (per_slot * w).sum(dim=-1) / w.sum(dim=-1).clamp(min=1.0)

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        """Log-probability (B,) of actions (B, K), reduced over slots."""
        logp, row, _ = self._rows()
        if row is None:
            return self._reduce(logp.gather(-1, actions.long().reshape(-1, self.n_slots, 1)).squeeze(-1))
        a = actions.long().reshape(row.shape)
        return self._reduce(logp.reshape(-1)[row * self.n_choices + a])

    def entropy(self) -> th.Tensor:
        """Entropy (B,), reduced over slots."""
        logp, row, _ = self._rows()
        ent = -(logp.exp() * logp).sum(dim=-1)
        return self._reduce(ent if row is None else ent[row])

    def sample(self) -> th.Tensor:
        lg = self.logits
        u = th.rand_like(lg).clamp(1e-12, 1.0 - 1e-7)
        return th.argmax(lg - th.log(-th.log(u)), dim=-1)

    def mode(self) -> th.Tensor:
        return th.argmax(self.logits, dim=-1)

    def actions_from_params(self, action_logits: th.Tensor, deterministic: bool = False) -> th.Tensor:
        self.proba_distribution(action_logits)
        return self.get_actions(deterministic=deterministic)

    def log_prob_from_params(self, action_logits: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        actions = self.actions_from_params(action_logits)
        return actions, self.log_prob(actions)


def awake_engines(servers: Any, engines_per_node: Any, n_engines: Any) -> Any:
    """Engines awake (D,) or (B, D) when ``servers`` servers are powered per datacenter: every
    engine of a powered server (the capacity head's rule; numpy arrays or torch tensors)."""
    if isinstance(servers, th.Tensor):
        return th.minimum(servers * engines_per_node, n_engines)
    import numpy as np

    return np.minimum(np.asarray(servers) * np.asarray(engines_per_node), np.asarray(n_engines))


class RouteCapacityDistribution(MaskableDistribution):
    """The distribution of the flattened capacity action
    (:class:`~carbon_gym.wrappers.FlattenCapacityAction`: route K | capacity D | servers D).

    The route part is a :class:`SlotCategorical`; the servers part one masked categorical per
    datacenter over n = 0..S_d powered servers (the capacity head's logits, (B, D, S + 1) with
    S = max_d S_d); the capacity part (awake engines) follows from the servers
    (:func:`awake_engines`) and adds nothing to the log-probability (its masks are not read).
    The log-probability and entropy are the route's plus the servers', each reduced as
    ``reduction`` says: ``"sum"`` over datacenters, or ``"mean"`` over the datacenters whose
    servers mask allows more than one value. Between capacity decisions the training env
    (:class:`train.envs.ScenarioMixEnv`) allows only the servers in force, so those steps add
    0 to the log-probability and the entropy: the head is trained on decision steps only.

    Args:
        route: the route part's distribution (K slots, D + 1 choices).
        n_engines, n_servers: (D,) engines and servers per datacenter of the training layout.
    """

    def __init__(self, route: SlotCategorical, n_engines: Any, n_servers: Any) -> None:
        super().__init__()
        self.route = route
        self.reduction = route.reduction
        eng = th.as_tensor([int(x) for x in n_engines], dtype=th.int64)
        srv = th.as_tensor([max(int(x), 1) for x in n_servers], dtype=th.int64)
        self.n_engines, self.n_servers = eng, srv
        self.engines_per_node = th.clamp(eng // srv, min=1)
        self.D, S1 = int(len(eng)), int(srv.max()) + 1
        self._route_size = route.n_slots * route.n_choices
        self._cap_size = int((eng + 1).sum())
        # flat index of (d, n) in the servers part of the mask (-1 beyond S_d)
        starts = th.cumsum(srv + 1, 0) - (srv + 1)
        n = th.arange(S1).unsqueeze(0)
        self._srv_index = th.where(n <= srv.unsqueeze(1), starts.unsqueeze(1) + n, th.full_like(n, -1))
        self._cap_logits: th.Tensor | None = None
        self._cap_mask: th.Tensor | None = None

    @property
    def action_size(self) -> int:
        """Entries of an action: K + 2 D."""
        return self.route.n_slots + 2 * self.D

    def proba_distribution_net(self, *args: Any, **kwargs: Any) -> nn.Module:
        """Unused: the logits come from :class:`~train.set_policy.SetNetwork`."""
        return nn.Identity()

    def proba_distribution(self, action_logits: th.Tensor, slot_class: th.Tensor | None = None,
                           capacity_logits: th.Tensor | None = None) -> RouteCapacityDistribution:
        """Route logits as :meth:`SlotCategorical.proba_distribution`; ``capacity_logits``
        (B, D, S + 1) the head's (masked beyond S_d)."""
        if capacity_logits is None:
            raise ConfigError("capacity_head", "the capacity action's distribution needs the head's logits")
        self.route.proba_distribution(action_logits, slot_class)
        self._cap_logits = capacity_logits
        self._cap_mask = None
        return self

    def apply_masking(self, masks: Any) -> None:
        """The flat mask of the flattened action (B, K x (D + 1) + sum(E_d + 1) + sum(S_d + 1))."""
        assert self._cap_logits is not None, "call proba_distribution first"
        if masks is None:
            self.route.apply_masking(None)
            self._cap_mask = None
            return
        m = th.as_tensor(masks, device=self._cap_logits.device).bool()
        m = m.reshape(-1, self._route_size + self._cap_size + int((self.n_servers + 1).sum()))
        self.route.apply_masking(m[:, :self._route_size])
        srv = m[:, self._route_size + self._cap_size:]
        idx = self._srv_index.to(m.device)
        self._cap_mask = srv[:, idx.clamp(min=0).reshape(-1)].reshape(m.shape[0], *idx.shape) & (idx >= 0)

    def capacity_log_probs(self) -> th.Tensor:
        """Log-probabilities (B, D, S + 1) of the servers per datacenter (masked at ~ -1e8)."""
        assert self._cap_logits is not None, "call proba_distribution first"
        z = self._cap_logits
        if self._cap_mask is not None:
            z = th.where(self._cap_mask, z, th.full_like(z, MASKED_LOGIT))
        return th.log_softmax(z, dim=-1)

    def _reduce_cap(self, per_dc: th.Tensor) -> th.Tensor:
        if self.reduction == "sum":
            return per_dc.sum(dim=-1)
        assert self._cap_logits is not None, "call proba_distribution first"
        allowed = self._cap_mask if self._cap_mask is not None else self._cap_logits > MASKED_LOGIT / 2
        w = (allowed.sum(dim=-1) > 1).to(per_dc.dtype)  # datacenters with a choice
        return (per_dc * w).sum(dim=-1) / w.sum(dim=-1).clamp(min=1.0)

    def _split(self, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        a = actions.long().reshape(-1, self.action_size)
        K = self.route.n_slots
        return a[:, :K], a[:, K + self.D:]

    def log_prob(self, actions: th.Tensor) -> th.Tensor:
        """Route plus servers log-probability (B,) of flat actions (B, K + 2 D)."""
        route, servers = self._split(actions)
        lp = self.capacity_log_probs().gather(-1, servers.unsqueeze(-1)).squeeze(-1)
        return self.route.log_prob(route) + self._reduce_cap(lp)

    def entropy(self) -> th.Tensor:
        lp = self.capacity_log_probs()
        return self.route.entropy() + self._reduce_cap(-(lp.exp() * lp).sum(dim=-1))

    def _actions(self, route: th.Tensor, servers: th.Tensor) -> th.Tensor:
        dev = servers.device
        awake = awake_engines(servers, self.engines_per_node.to(dev), self.n_engines.to(dev))
        return th.cat([route, awake, servers], dim=-1)

    def sample(self) -> th.Tensor:
        lp = self.capacity_log_probs()
        u = th.rand_like(lp).clamp(1e-12, 1.0 - 1e-7)
        return self._actions(self.route.sample(), th.argmax(lp - th.log(-th.log(u)), dim=-1))

    def mode(self) -> th.Tensor:
        return self._actions(self.route.mode(), th.argmax(self.capacity_log_probs(), dim=-1))

    def actions_from_params(self, action_logits: th.Tensor, deterministic: bool = False, **kwargs: Any) -> th.Tensor:
        self.proba_distribution(action_logits, **kwargs)
        return self.get_actions(deterministic=deterministic)

    def log_prob_from_params(self, action_logits: th.Tensor, **kwargs: Any) -> tuple[th.Tensor, th.Tensor]:
        actions = self.actions_from_params(action_logits, **kwargs)
        return actions, self.log_prob(actions)
