"""Behaviour cloning of the set policy on an expert's decisions, collected through ``env.step``.

The expert (by default the facility MILP, ``carbon_gym.make_policy("milp", env)``) acts in
training episodes (training scenarios, training days); every step's observation, action mask
and the expert's per-request choices are stored. The set network is then fitted by masked
cross-entropy over the pending requests (mean over requests), and its critic by regression on
the expert's discounted returns of VecNormalize-scaled rewards (so PPO fine-tuning starts with a
critic that matches the policy it inherits). :func:`reward_scale_stats` gives the running
statistics VecNormalize would have gathered on the same rewards, to seed it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from carbon_gym.errors import ConfigError

from .envs import training_episode

__all__ = ["ExpertData", "make_expert", "collect_expert", "discounted_returns", "reward_scale_stats", "behaviour_clone"]


@dataclass
class ExpertData:
    """Expert transitions: observation parts (T, ...), masks (T, K, D + 1), actions (T, K),
    rewards (T,), episode index (T,), and the expert's decision time per step (T,)."""

    datacenters: np.ndarray
    slots: np.ndarray
    globals: np.ndarray
    masks: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    episode: np.ndarray
    decision_s: np.ndarray
    meta: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.actions.shape[0])


def make_expert(name: str, env: Any) -> Any:
    """The expert policy ``name`` for ``env``: any name of the policy registry
    (:func:`carbon_gym.registry.make_policy`: ``"rr"``, ``"milp"``, ``"ilp-state"``, ...)."""
    from carbon_gym.registry import make_policy

    try:
        return make_policy(name, env)
    except ConfigError as exc:
        raise ConfigError("bc.expert", str(exc)) from None


def collect_expert(
    expert: str,
    scenarios: Sequence[str],
    overrides: dict[str, Any] | None,
    *,
    episodes: int,
    seed: int,
    heldout_every_days: int = 4,
    log: Callable[[str], None] | None = None,
) -> ExpertData:
    """Run ``episodes`` expert episodes (scenario i mod len, random training day) and record them."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("dc", "sl", "gl", "mask", "act", "rew", "ep", "dt")}
    meta = []
    for ep in range(int(episodes)):
        scenario, start, world_seed, env = training_episode(scenarios, ep, rng, overrides, heldout_every_days)
        policy = make_expert(expert, env)
        t0 = time.perf_counter()
        obs, info = env.reset(seed=world_seed)
        reset_fn = getattr(policy, "reset", None)
        if callable(reset_fn):
            reset_fn(env)
        done = False
        steps = 0
        while not done:
            mask = np.asarray(info["action_mask"], dtype=bool)
            t1 = time.perf_counter()
            action = np.asarray(policy.act(obs, info), dtype=np.int64)
            parts["dt"].append(np.array([time.perf_counter() - t1]))
            parts["dc"].append(np.asarray(obs["datacenters"], np.float32)[None])
            parts["sl"].append(np.asarray(obs["slots"], np.float32)[None])
            parts["gl"].append(np.asarray(obs["globals"], np.float32)[None])
            parts["mask"].append(mask[None])
            parts["act"].append(action[None])
            obs, reward, terminated, truncated, info = env.step(action)
            parts["rew"].append(np.array([reward], np.float64))
            parts["ep"].append(np.array([ep]))
            done = bool(terminated or truncated)
            steps += 1
        em = info.get("episode_metrics", {})
        meta.append({"scenario": scenario, "start_utc": start, "seed": world_seed, "steps": steps,
                     "carbon_g": em.get("carbon_g"), "violation_rate": em.get("violation_rate"),
                     "wall_s": time.perf_counter() - t0})
        if log:
            log(f"bc: expert {expert!r} episode {ep + 1}/{episodes} on {scenario} from {start}: {steps} steps, "
                f"carbon {em.get('carbon_g', float('nan')):.1f} g, violation rate {em.get('violation_rate', float('nan')):.4f}, "
                f"{time.perf_counter() - t0:.1f} s")
        env.close()
    cat = {k: np.concatenate(v) for k, v in parts.items()}
    return ExpertData(cat["dc"], cat["sl"], cat["gl"], cat["mask"], cat["act"], cat["rew"], cat["ep"], cat["dt"], meta)


def discounted_returns(rewards: np.ndarray, episode: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma G_{t+1} within each episode (0 after its last step)."""
    out = np.zeros_like(rewards, dtype=np.float64)
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        if t == len(rewards) - 1 or episode[t + 1] != episode[t]:
            g = 0.0
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


def reward_scale_stats(rewards: np.ndarray, episode: np.ndarray, gamma: float) -> tuple[float, float, int]:
    """(mean, var, count) of the running discounted return VecNormalize tracks (``R_t = gamma R_{t-1} + r_t``,
    reset per episode) over the given rewards."""
    acc = np.zeros_like(rewards, dtype=np.float64)
    r = 0.0
    for t in range(len(rewards)):
        if t > 0 and episode[t] != episode[t - 1]:
            r = 0.0
        r = gamma * r + float(rewards[t])
        acc[t] = r
    return float(acc.mean()), float(acc.var()), int(acc.size)


def behaviour_clone(
    net: Any,
    data: ExpertData,
    *,
    epochs: int,
    batch_steps: int,
    learning_rate: float,
    value_weight: float,
    gamma: float,
    reward_std: float,
    seed: int = 0,
    logger: Any = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Fit ``net`` (a :class:`~train.set_policy.SetNetwork`) to the expert. With more than one
    episode, the last one is held out for validation. Returns the final losses and accuracies
    (accuracy = share of pending requests whose most likely choice is the expert's)."""
    import torch as th

    gen = th.Generator().manual_seed(int(seed))
    T = len(data)
    if T == 0:
        raise ConfigError("bc.episodes", "the expert produced no steps")
    last = int(data.episode.max())
    val_idx = np.flatnonzero(data.episode == last) if last > 0 else np.zeros(0, dtype=np.int64)
    train_idx = np.flatnonzero(data.episode != last) if last > 0 else np.arange(T)
    returns = discounted_returns(data.rewards, data.episode, gamma) / max(reward_std, 1e-8)
    opt = th.optim.Adam(net.parameters(), lr=float(learning_rate))
    D1 = data.masks.shape[-1]
    K = data.masks.shape[1]

    def batch(idx: np.ndarray) -> tuple[dict[str, th.Tensor], th.Tensor, th.Tensor, th.Tensor, th.Tensor]:
        obs = {
            "datacenters": th.from_numpy(data.datacenters[idx]),
            "slots": th.from_numpy(data.slots[idx]),
            "globals": th.from_numpy(data.globals[idx]),
        }
        mask = th.from_numpy(data.masks[idx])
        act = th.from_numpy(data.actions[idx]).long().clamp_(0, D1 - 1)
        valid = mask[:, :, :-1].any(dim=-1)  # pending requests with at least one datacenter
        return obs, mask, act, valid, th.from_numpy(returns[idx]).float()

    def losses(idx: np.ndarray) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        obs, mask, act, valid, ret = batch(idx)
        logits, value = net(obs)
        logits = logits.reshape(len(idx), K, D1).masked_fill(~mask, -1e8)
        logp = th.log_softmax(logits, dim=-1)
        chosen = logp.gather(-1, act.unsqueeze(-1)).squeeze(-1)
        w = valid.float()
        n = w.sum().clamp(min=1.0)
        ce = -(chosen * w).sum() / n
        acc = ((logits.argmax(dim=-1) == act).float() * w).sum() / n
        vloss = ((value.squeeze(-1) - ret) ** 2).mean()
        return ce, vloss, acc

    hist = []
    t0 = time.perf_counter()
    net.train()
    for epoch in range(int(epochs)):
        perm = train_idx[th.randperm(len(train_idx), generator=gen).numpy()]
        tot = {"ce": 0.0, "v": 0.0, "acc": 0.0}
        nb = 0
        for i in range(0, len(perm), int(batch_steps)):
            idx = np.sort(perm[i:i + int(batch_steps)])
            ce, vloss, acc = losses(idx)
            loss = ce + float(value_weight) * vloss
            opt.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            tot["ce"] += float(ce.detach())
            tot["v"] += float(vloss.detach())
            tot["acc"] += float(acc.detach())
            nb += 1
        row = {"epoch": epoch, "ce": tot["ce"] / nb, "value_loss": tot["v"] / nb, "accuracy": tot["acc"] / nb}
        if val_idx.size:
            with th.no_grad():
                vce, vv, vacc = [], [], []
                for i in range(0, len(val_idx), int(batch_steps)):
                    a, b, c = losses(val_idx[i:i + int(batch_steps)])
                    vce.append(float(a))
                    vv.append(float(b))
                    vacc.append(float(c))
            row.update(val_ce=float(np.mean(vce)), val_value_loss=float(np.mean(vv)), val_accuracy=float(np.mean(vacc)))
        hist.append(row)
        if logger is not None:
            for k, v in row.items():
                if k != "epoch":
                    logger.record(f"bc/{k}", v)
            logger.dump(epoch)
        if log:
            log(f"bc: epoch {epoch}: "  + ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "epoch")
                + f" ({time.perf_counter() - t0:.0f} s)")
    net.eval()
    return {"history": hist, "steps": T, "train_steps": int(train_idx.size), "val_steps": int(val_idx.size),
            "wall_s": time.perf_counter() - t0}
