"""Class-level imitation of the facility MILP with DAgger, for the class set policy.

The facility MILP decides per request *class* (origin x output-length bin x used-TTFT bin): it
splits each class's N_c requests over the datacenters. A class network
(``SetNetwork(classes=...)``, the same binning) scores each class once, so it is trained on the
same unit: every recorded step is compressed to its classes (class-mean slot rows, the expert's
choice counts per class (C, D + 1) and the class masks), and the loss is the cross-entropy of
the expert's counts under the class's choice distribution, ``-sum_cd n_cd log p_cd / sum n``
(equal to the per-request cross-entropy, at a fraction of the cost).

DAgger (:func:`run_dagger`): round 0 records expert episodes (the MILP acts); every later round
the current policy acts (numpy path, sampling) and the MILP labels the states it visits; the
data are aggregated and the network trained further. After each round the policy is scored on
validation episodes (held-out day, not the test days of ``carbon-gym train evaluate``) against
round-robin and the MILP; the best round by :func:`validation_score` is kept.

Class data do not depend on the slot count K, so scenarios with different ``env.max_pending``
(low: 2048, moderate/high: 4096) are mixed freely.

Capacity (``set_policy.capacity_head``, ``capacity.control = "agent"`` in the overrides): at each
of the expert's capacity decisions (its action is then ``{"route", "capacity", "servers"}``) the
step's datacenter rows and the expert's powered servers per datacenter are recorded
(:class:`CapacityStep`); the head is trained on their cross-entropy (weight
``dagger.capacity_weight``) with the routing loss, and in DAgger rounds the learner's head takes
the capacity decisions (argmax) while the expert labels them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from carbon_gym.errors import ConfigError

from .envs import heldout_starts, make_episode_env, training_episode

__all__ = ["ClassStep", "CapacityStep", "capacity_step", "compress_step", "collect", "class_bc", "validation_episode", "validation_score", "run_dagger"]


@dataclass
class ClassStep:
    """One env step compressed to its request classes."""

    dc: np.ndarray  # (D, F_D) float32
    gl: np.ndarray  # (F_G,) float32
    totals: np.ndarray  # (3,) valid slots, prompt sum, predicted-output sum (obs units)
    rows: np.ndarray  # (C, F_S) float32 class rows (class-mean prompt, output, waited, network)
    counts: np.ndarray  # (C, D + 1) float32 expert choices per class
    mask: np.ndarray  # (C, D + 1) bool, the class's first member's mask


@dataclass
class CapacityStep:
    """One capacity decision of the expert: the step's datacenter rows, globals and slot totals
    (as :class:`ClassStep`), the expert's powered servers (D,), the up flags (D,) and the
    topology's servers and engines per datacenter (D,)."""

    dc: np.ndarray
    gl: np.ndarray
    totals: np.ndarray
    servers: np.ndarray
    up: np.ndarray
    n_servers: np.ndarray
    n_engines: np.ndarray


def capacity_step(scorer: Any, obs: dict[str, Any], expert_servers: Any) -> CapacityStep:
    """The :class:`CapacityStep` of an observation at an expert capacity decision."""
    sc = scorer
    slots = np.asarray(obs["slots"], dtype=np.float32).reshape(-1, sc.F_S)
    rows = slots[slots[:, sc._s_valid] > 0.5].astype(np.float64)
    dc = np.asarray(obs["datacenters"], dtype=np.float32).reshape(sc.D, sc.F_D)
    totals = np.array([rows.shape[0], rows[:, sc._s_prompt].sum(), rows[:, sc._s_pred].sum()])
    return CapacityStep(dc, np.asarray(obs["globals"], dtype=np.float32).copy(), totals,
                        np.asarray(expert_servers, dtype=np.int64).copy(), dc[:, sc._c_up] > 0.5,
                        np.asarray(sc._n_servers, dtype=np.int64).copy(), np.asarray(sc._engines, dtype=np.int64).copy())


def compress_step(scorer: Any, obs: dict[str, Any], mask: np.ndarray, expert_action: np.ndarray) -> ClassStep | None:
    """The :class:`ClassStep` of one observation (None when no request is pending)."""
    sc = scorer
    K = int(np.asarray(mask).shape[0])
    slots = np.asarray(obs["slots"], dtype=np.float32).reshape(K, sc.F_S)
    valid = slots[:, sc._s_valid] > 0.5
    idx = np.flatnonzero(valid)
    if idx.size == 0:
        return None
    rows = slots[idx]
    dc = np.asarray(obs["datacenters"], dtype=np.float32).reshape(sc.D, sc.F_D)
    crow, inv, rep, _ = sc.group(rows, dc)
    out = rows[rep].copy()
    out[:, sc._cols] = crow.astype(np.float32)
    C1 = sc.D + 1
    act = np.asarray(expert_action, dtype=np.int64)[idx].clip(0, C1 - 1)
    counts = np.bincount(inv * C1 + act, minlength=len(rep) * C1).reshape(len(rep), C1).astype(np.float32)
    m = np.asarray(mask, dtype=bool)[idx][rep]
    counts = np.where(m, counts, 0.0).astype(np.float32)
    r64 = rows.astype(np.float64)
    totals = np.array([len(idx), r64[:, sc._s_prompt].sum(), r64[:, sc._s_pred].sum()])
    return ClassStep(dc, np.asarray(obs["globals"], dtype=np.float32).copy(), totals, out, counts, m)


def collect(net: Any, expert: str, scenarios: Sequence[str], overrides: dict[str, Any], *, episodes: int,
            learner_acts: bool, rng: np.random.Generator, heldout_every_days: int = 4, mode: str = "sample",
            log: Callable[[str], None] | None = None,
            capacity: list[CapacityStep] | None = None) -> tuple[list[ClassStep], list[dict[str, Any]]]:
    """Run ``episodes`` episodes (scenario i mod len, random training day); the expert labels every
    step; the learner (``net`` through the numpy path) acts when ``learner_acts``, else the expert.
    ``capacity`` (a list) receives a :class:`CapacityStep` at every expert capacity decision; with
    a capacity head the learner then also takes the capacity decision (argmax)."""
    from .bc import make_expert
    from .fast import NumpySetScorer, choose

    scorer = NumpySetScorer(net)
    steps: list[ClassStep] = []
    meta = []
    for ep in range(int(episodes)):
        scenario, start, seed, env = training_episode(scenarios, ep, rng, overrides, heldout_every_days)
        t0 = time.perf_counter()
        obs, info = env.reset(seed=seed)
        exp = make_expert(expert, env)
        if callable(getattr(exp, "reset", None)):
            exp.reset(env)
        scorer.bind(env.unwrapped.layout)
        act_rng = np.random.default_rng(seed)
        n0 = len(steps)
        n0_cap = len(capacity) if capacity is not None else 0
        done = False
        while not done:
            mask = np.asarray(info["action_mask"], dtype=bool)
            raw = exp.act(obs, info)
            decision = isinstance(raw, dict) and "servers" in raw
            if decision and capacity is not None:
                capacity.append(capacity_step(scorer, obs, raw["servers"]))
            a_exp = np.asarray(raw["route"] if isinstance(raw, dict) else raw, dtype=np.int64)
            st = compress_step(scorer, obs, mask, a_exp)
            if st is not None:
                steps.append(st)
            action: Any = raw
            scorer._last_e = None
            if learner_acts and st is not None:
                K = mask.shape[0]
                slots = np.asarray(obs["slots"]).reshape(K, scorer.F_S)
                idx = np.flatnonzero(slots[:, scorer._s_valid] > 0.5)
                logits, inv, _, _ = scorer.class_logits(obs["datacenters"], slots[idx], obs["globals"])
                action = np.full(K, scorer.D, dtype=np.int64)
                rank = scorer.last_ranks() if mode == "systematic" else None
                action[idx] = choose(logits, mask[idx], inv, mode, act_rng, rank)
            elif learner_acts:
                action = a_exp
            if learner_acts and decision and scorer.capacity_head:
                servers = scorer.capacity_logits(obs["datacenters"], obs["globals"]).argmax(axis=1).astype(np.int64)
                awake = np.minimum(servers * scorer.engines_per_node, scorer._engines)
                action = {"route": np.asarray(action["route"] if isinstance(action, dict) else action),
                          "capacity": awake, "servers": servers}
            obs, _, term, trunc, info = env.step(action)
            done = bool(term or trunc)
        em = info.get("episode_metrics", {})
        meta.append({"scenario": scenario, "start_utc": start, "seed": seed, "learner_acts": bool(learner_acts), "n_steps": len(steps) - n0,
                     "n_capacity": (len(capacity) - n0_cap) if capacity is not None else 0,
                     "carbon_g": em.get("carbon_g"), "violation_rate": em.get("violation_rate"), "wall_s": time.perf_counter() - t0})
        if log:
            log(f"imitate: {'learner' if learner_acts else 'expert'} episode {ep + 1}/{episodes} {scenario} {start}: "
                f"violation rate {em.get('violation_rate', float('nan')):.4f} ({time.perf_counter() - t0:.0f} s)")
        env.close()
    return steps, meta


def _batch(steps: Sequence[ClassStep]) -> tuple[Any, ...]:
    import torch as th

    B = len(steps)
    C = max(s.rows.shape[0] for s in steps)
    F = steps[0].rows.shape[1]
    C1 = steps[0].counts.shape[1]
    rows = np.zeros((B, C, F), np.float32)
    counts = np.zeros((B, C, C1), np.float32)
    mask = np.ones((B, C, C1), bool)
    for i, s in enumerate(steps):
        c = s.rows.shape[0]
        rows[i, :c], counts[i, :c], mask[i, :c] = s.rows, s.counts, s.mask
    dc = np.stack([s.dc for s in steps])
    gl = np.stack([s.gl for s in steps])
    tot = np.stack([s.totals for s in steps])
    return (th.from_numpy(dc), th.from_numpy(gl), th.from_numpy(rows), th.from_numpy(tot),
            th.from_numpy(counts), th.from_numpy(mask))


def _loss(net: Any, batch: tuple[Any, ...], with_aggregate: bool = False) -> tuple[Any, ...]:
    """(cross-entropy per expert decision, size-weighted total variation between the policy's
    class distribution and the expert's split[, aggregate loss]). The aggregate loss compares
    each step's expected share of requests and of prompt tokens per choice (datacenter or
    defer) with the expert's (total variation, mean of the two): what loads the datacenters,
    whichever classes carry it."""
    import torch as th

    dc, gl, rows, tot, counts, mask = batch
    logits = net.class_scores(dc, gl, rows, tot, counts.sum(dim=-1)).masked_fill(~mask, -1e8)
    logp = th.log_softmax(logits, dim=-1)
    n = counts.sum().clamp(min=1.0)
    ce = -(counts * logp).sum() / n
    size = counts.sum(dim=-1, keepdim=True)
    p = logp.exp()
    tv = 0.5 * (size * (p - counts / size.clamp(min=1.0))).abs().sum() / n
    if not with_aggregate:
        return ce, tv
    prompt = rows[:, :, net._s_prompt].unsqueeze(-1).to(p.dtype)
    n_step = size.sum(dim=1).clamp(min=1.0)  # (B, 1)
    req = ((size * p).sum(dim=1) - counts.sum(dim=1)).abs().sum(dim=-1, keepdim=True) / n_step
    tok_n = (size * prompt).sum(dim=1).clamp(min=1e-6)
    tok = ((size * p * prompt).sum(dim=1) - (counts * prompt).sum(dim=1)).abs().sum(dim=-1, keepdim=True) / tok_n
    agg = 0.25 * (req + tok).mean()
    return ce, tv, agg


def capacity_loss(net: Any, steps: Sequence[CapacityStep]) -> tuple[Any, float, float]:
    """(cross-entropy of the expert's powered servers under the capacity head, mean over the up
    datacenters of the steps; the share of them where the head's argmax is the expert's choice;
    the mean absolute error of the argmax, servers). Steps are grouped by topology."""
    import torch as th

    groups: dict[tuple[tuple[int, ...], tuple[int, ...]], list[CapacityStep]] = {}
    for st in steps:
        groups.setdefault((tuple(st.n_servers.tolist()), tuple(st.n_engines.tolist())), []).append(st)
    total = th.zeros(())
    n = hits = err = 0.0
    for (srv, eng), grp in groups.items():
        dc = th.from_numpy(np.stack([s.dc for s in grp]))
        gl = th.from_numpy(np.stack([s.gl for s in grp]))
        tot = th.from_numpy(np.stack([s.totals for s in grp]))
        z = net.capacity_scores(dc, gl, tot, n_servers=np.array(srv), n_engines=np.array(eng))  # (B, D, S + 1)
        lab = th.from_numpy(np.stack([np.clip(s.servers, 0, np.array(srv)) for s in grp]))
        up = th.from_numpy(np.stack([s.up for s in grp]))
        logp = th.log_softmax(z, dim=-1).gather(-1, lab.unsqueeze(-1)).squeeze(-1)
        total = total - (logp * up).sum()
        pick = z.argmax(dim=-1)
        hits += float(((pick == lab) & up).sum())
        err += float(((pick - lab).abs() * up).sum())
        n += float(up.sum())
    return total / max(n, 1.0), hits / max(n, 1.0), err / max(n, 1.0)


def class_bc(net: Any, steps: Sequence[ClassStep], val: Sequence[ClassStep], *, epochs: int, batch_steps: int,
             learning_rate: float, seed: int, aggregate_weight: float = 0.0,
             log: Callable[[str], None] | None = None, capacity: Sequence[CapacityStep] = (),
             val_capacity: Sequence[CapacityStep] = (), capacity_weight: float = 1.0) -> list[dict[str, float]]:
    """Fit ``net`` on class steps (Adam, gradient clipping 1.0): cross-entropy plus
    ``aggregate_weight`` x the aggregate loss (see :func:`_loss`), plus ``capacity_weight`` x the
    capacity head's cross-entropy on the ``capacity`` steps (:func:`capacity_loss`; one slice of
    them with every routing batch). Returns per-epoch statistics."""
    import torch as th

    g = np.random.default_rng(seed)
    opt = th.optim.Adam(net.parameters(), lr=float(learning_rate))
    hist = []
    t0 = time.perf_counter()
    net.train()
    vb = [_batch(val[i:i + 64]) for i in range(0, len(val), 64)] if val else []
    use_cap = bool(capacity) and bool(getattr(net, "capacity_head", False))
    for epoch in range(int(epochs)):
        perm = g.permutation(len(steps))
        n_batches = max(-(-len(perm) // int(batch_steps)), 1)
        cap_perm = g.permutation(len(capacity)) if use_cap else np.zeros(0, dtype=np.int64)
        cap_chunks = np.array_split(cap_perm, n_batches) if use_cap else []
        tot_ce = tot_tv = tot_agg = tot_cap = 0.0
        nb = 0
        for bi, i in enumerate(range(0, len(perm), int(batch_steps))):
            ce, tv, agg = _loss(net, _batch([steps[j] for j in perm[i:i + int(batch_steps)]]), with_aggregate=True)
            loss = ce + float(aggregate_weight) * agg if aggregate_weight else ce
            if use_cap and len(cap_chunks[bi]):
                cap_ce = capacity_loss(net, [capacity[j] for j in cap_chunks[bi]])[0]
                loss = loss + float(capacity_weight) * cap_ce
                tot_cap += float(cap_ce.detach())
            opt.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            tot_ce += float(ce.detach())
            tot_tv += float(tv.detach())
            tot_agg += float(agg.detach())
            nb += 1
        row = {"epoch": float(epoch), "ce": tot_ce / max(nb, 1), "tv": tot_tv / max(nb, 1), "aggregate": tot_agg / max(nb, 1)}
        if use_cap:
            row["capacity_ce"] = tot_cap / max(sum(1 for c in cap_chunks if len(c)), 1)
            if val_capacity:
                with th.no_grad():
                    vce, vacc, vmae = capacity_loss(net, val_capacity)
                row.update(val_capacity_ce=float(vce), val_capacity_acc=vacc, val_capacity_mae=vmae)
        if vb:
            with th.no_grad():
                vals = [_loss(net, b, with_aggregate=True) for b in vb]
            row.update(val_ce=float(np.mean([float(v[0]) for v in vals])), val_tv=float(np.mean([float(v[1]) for v in vals])),
                       val_aggregate=float(np.mean([float(v[2]) for v in vals])))
        hist.append(row)
        if log and (epoch == int(epochs) - 1 or epoch % 5 == 0):
            log(f"imitate: epoch {epoch:d}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "epoch")
                + f" ({time.perf_counter() - t0:.0f} s)")
    net.eval()
    return hist


def validation_episode(policy: Any, scenario: str, overrides: dict[str, Any], start_utc: str, seed: int) -> dict[str, float]:
    """Carbon (g), violation rate and mean decision time of ``policy`` on one episode."""
    from carbon_gym.policy import rollout

    env = make_episode_env(scenario, overrides, start_utc)
    try:
        m = rollout(env, policy, seed=seed)
    finally:
        env.close()
    return {"carbon_g": float(m["carbon_g"]), "violation_rate": float(m["violation_rate"]), "decision_s_mean": float(m["decision_s_mean"])}


def validation_score(learned: dict[str, dict[str, float]], refs: dict[str, dict[str, dict[str, float]]], violation_weight: float = 2.0) -> float:
    """Mean over validation scenarios of ``reduction vs rr (pp) - violation_weight x (violation
    rate - the MILP's, pp)^+``: the issue's target is the MILP's reduction at no more violations."""
    out = []
    for scen, m in learned.items():
        rr, milp = refs[scen]["rr"], refs[scen]["milp"]
        red = 100.0 * (1.0 - m["carbon_g"] / rr["carbon_g"])
        excess = max(0.0, 100.0 * (m["violation_rate"] - milp["violation_rate"]))
        out.append(red - violation_weight * excess)
    return float(np.mean(out))


def run_dagger(cfg: Any, run_dir: str | Path, *, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The imitation run of a config with a ``[dagger]`` section (see :class:`train.config.DaggerConfig`).
    Writes ``<run_dir>/dagger.json`` (per-round statistics), ``round_<i>.pt`` (network weights),
    ``tb/`` (TensorBoard: ``imitate/*`` per epoch; per round the validation's
    ``eval/reduction_vs_rr_pct`` and ``slo/violation_rate``, means over the validation scenarios and
    per scenario as ``<tag>/<scenario>``, x = epochs so far) and ``best.npz`` (the best round's
    network in the pickle-free checkpoint format, :mod:`train.checkpoint`, recording ``eval_mode``,
    the config and the data days); returns the summary."""
    import torch as th

    from carbon_gym.policy import RoundRobinPolicy

    from .bc import make_expert
    from .checkpoint import env_fingerprint, save_set_checkpoint
    from .policy import LearnedPolicy
    from .set_policy import SetNetwork, layout_spec

    from stable_baselines3.common.logger import configure

    from .tags import TAGS

    dg = cfg.dagger
    if dg is None:
        raise ConfigError("dagger", "the config has no [dagger] section")
    th.set_num_threads(int(cfg.torch_threads))
    th.manual_seed(int(cfg.seed))
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    if (run / "dagger.json").exists():
        raise ConfigError("run_dir", f"{run} already holds an imitation run: pass another --run-dir")
    logger = configure(str(run / "tb"), ["csv", "tensorboard"])
    epoch_step = 0
    scenarios = list(dg.scenarios or cfg.scenarios)
    over = dict(dg.overrides)
    probe = make_episode_env(scenarios[0], over, None)
    sp = dict(cfg.set_policy)
    sp.pop("logprob_reduction", None)
    net = SetNetwork(layout_spec(probe), **sp)
    fingerprint = [env_fingerprint(probe)]
    probe.close()
    for s_ in scenarios[1:]:  # (the training envs, one per scenario)
        e_ = make_episode_env(s_, over, None)
        fingerprint.append(env_fingerprint(e_))
        e_.close()
    rng = np.random.default_rng(int(cfg.seed) + 7919)
    seq = heldout_starts(int(dg.val_starts), cfg.heldout_every_days, seed=cfg.seed + 97)
    val_start = dg.val_start_utc or seq[0]
    starts = [val_start] + seq[1:]
    # validation episodes: (scenario, start); the first start keeps the bare scenario name as key
    val_eps = {(s if i == 0 else f"{s}@{st}"): (s, st) for i, st in enumerate(starts) for s in (dg.val_scenarios or scenarios)}
    t_all = time.perf_counter()
    refs: dict[str, dict[str, dict[str, float]]] = {}
    for key, (s, st) in val_eps.items():
        env = make_episode_env(s, over, st)
        refs[key] = {"rr": validation_episode(RoundRobinPolicy(), s, over, st, dg.val_seed),
                     "milp": validation_episode(make_expert(dg.expert, env), s, over, st, dg.val_seed)}
        env.close()
        log(f"imitate: validation {s} {st}: rr {refs[key]['rr']}, {dg.expert} {refs[key]['milp']}")
    data: list[ClassStep] = []
    val_data: list[ClassStep] = []
    cap_data: list[CapacityStep] = []
    val_cap: list[CapacityStep] = []
    rounds = []
    best = (-np.inf, -1)
    for rd in range(int(dg.rounds) + 1):
        t0 = time.perf_counter()
        n_ep = dg.expert_episodes if rd == 0 else dg.episodes_per_round
        caps: list[CapacityStep] = []
        steps, meta = collect(net, dg.expert, scenarios, over, episodes=n_ep, learner_acts=rd > 0, rng=rng,
                              heldout_every_days=cfg.heldout_every_days, mode=dg.rollout_mode, log=log,
                              capacity=caps if net.capacity_head else None)
        if rd == 0 and len(meta) > 1:  # the last expert episode is the imitation validation set
            cut = len(steps) - int(meta[-1]["n_steps"])
            val_data, steps = steps[cut:], steps[:cut]
            cut_c = len(caps) - int(meta[-1]["n_capacity"])
            val_cap, caps = caps[cut_c:], caps[:cut_c]
        data.extend(steps)
        cap_data.extend(caps)
        collect_s = time.perf_counter() - t0
        hist = class_bc(net, data, val_data, epochs=dg.epochs, batch_steps=dg.batch_steps,
                        learning_rate=dg.learning_rate * (dg.lr_decay ** rd), seed=int(cfg.seed) + rd,
                        aggregate_weight=dg.aggregate_weight, log=log, capacity=cap_data, val_capacity=val_cap,
                        capacity_weight=dg.capacity_weight)
        th.save(net.state_dict(), run / f"round_{rd}.pt")
        for h in hist:  # imitation losses per epoch, then the round's validation (domain tags)
            for k, v in h.items():
                if k != "epoch":
                    logger.record(f"imitate/{k}", v)
            logger.dump(epoch_step)
            epoch_step += 1
        pol = LearnedPolicy(net, mode=dg.eval_mode, seed=0)  # (the numpy path, weights as of now)
        learned = {key: validation_episode(pol, s, over, st, dg.val_seed) for key, (s, st) in val_eps.items()}
        score = validation_score(learned, refs, dg.violation_weight)
        row = {"round": rd, "steps": len(data), "capacity_steps": len(cap_data), "collect_s": collect_s, "train_s": time.perf_counter() - t0 - collect_s,
               "episodes": meta, "bc": hist[-1] if hist else {}, "bc_history": hist, "validation": learned, "score": score}
        for s, m in learned.items():
            row[f"reduction_{s}"] = 100.0 * (1.0 - m["carbon_g"] / refs[s]["rr"]["carbon_g"])
            row[f"violation_{s}"] = m["violation_rate"]
        rounds.append(row)
        for s_, m in learned.items():
            logger.record(f"{TAGS.reduction_vs_rr_pct}/{s_}", row[f"reduction_{s_}"])
            logger.record(f"{TAGS.slo_violation_rate}/{s_}", m["violation_rate"])
            logger.record(f"{TAGS.decision_time_s}/{s_}", m["decision_s_mean"])
        logger.record(TAGS.reduction_vs_rr_pct, float(np.mean([row[f"reduction_{s_}"] for s_ in learned])))
        logger.record(TAGS.slo_violation_rate, float(np.mean([m["violation_rate"] for m in learned.values()])))
        logger.record("imitate/score", score)
        logger.record("imitate/steps", len(data))
        logger.dump(epoch_step)
        if score > best[0]:
            best = (score, rd)
        log(f"imitate: round {rd}: {len(data)} steps, " + ", ".join(
            f"{s} reduction {row[f'reduction_{s}']:.1f}% violations {100 * row[f'violation_{s}']:.2f}%" for s in val_eps)
            + f", score {score:.2f} ({time.perf_counter() - t0:.0f} s)")
        (run / "dagger.json").write_text(json.dumps({"refs": refs, "val_start_utc": val_start, "val_starts_utc": starts, "rounds": rounds,
                                                      "best_round": best[1], "wall_s": time.perf_counter() - t_all}, indent=1, default=float))
    net.load_state_dict(th.load(run / f"round_{best[1]}.pt", weights_only=True))  # (tensors only: nothing unpickled runs code)
    training = {"method": "class-level DAgger (carbon-gym train imitate)", "config": cfg.to_dict(),
                "data_days": {"heldout_every_days": cfg.heldout_every_days,
                              "training_days": f"days of the year d with d % {cfg.heldout_every_days} != 0",
                              "training_starts_utc": [[e["scenario"], e["start_utc"]] for r in rounds for e in r["episodes"]],
                              "validation_starts_utc": starts},
                "best_round": best[1], "run_dir": str(run)}
    best_path = save_set_checkpoint(run / "best.npz", net, policy={"mode": dg.eval_mode}, training=training,
                                    fingerprint=fingerprint)
    log(f"imitate: best round {best[1]} (score {best[0]:.2f}) -> {best_path} ({time.perf_counter() - t_all:.0f} s in all)")
    return {"best_round": best[1], "best": str(best_path), "rounds": rounds, "refs": refs}
