"""Training-run configuration: a TOML file -> :class:`TrainConfig` (validated).

Example (``train/configs/llama8b.toml``)::

    name = "llama8b"
    algorithm = "maskable_ppo"          # or "ppo" (RoutingWeightsWrapper, MultiInputPolicy)
    scenarios = ["llama8b-low", "llama8b-moderate"]   # each training episode picks one
    overrides = { duration_s = 60, "env.max_pending" = 2048 }
    seed = 0
    n_envs = 2
    total_timesteps = 2048

    [ppo]                # keyword arguments of the SB3 algorithm
    learning_rate = 1e-4
    n_steps = 64

    [set_policy]         # maskable_ppo only (see train.set_policy.SetNetwork)
    hidden = 64
    classes = false      # true: score the facility MILP's request classes once each
    demand_features = false
    load_feedback = 0    # refinement passes with learned per-datacenter prices
    capacity_head = false  # per-datacenter powered-server head (needs capacity.control = "agent")

    [vec_normalize]      # reward normalisation (VecNormalize); obs are already scaled by the env
    reward = true

    [bc]                 # behaviour-cloning warm start (maskable_ppo only)
    expert = "milp"
    episodes = 4

    init_checkpoint = "runs/train/x/best.npz"   # or: start PPO from a set-policy checkpoint
                                                 # (pickle-free .npz, e.g. a DAgger run's best)

    [dagger]             # class-level DAgger on an expert (carbon-gym train imitate; needs classes)
    expert = "facility-milp"
    rounds = 10

    [eval]               # held-out evaluation episode logged to TensorBoard
    scenario = "llama8b-moderate"
    every_timesteps = 512

    [checkpoint]
    every_timesteps = 512

    [slo_constraint]     # p99-aware Lagrangian SLO constraint on the reward (train.lagrangian)
    budget = 0.005       # share of completions allowed over each MLPerf target

Unknown keys raise :class:`~carbon_gym.errors.ConfigError` naming the key and the allowed ones.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from carbon_gym.errors import ConfigError

__all__ = ["TrainConfig", "BCConfig", "DaggerConfig", "EvalConfig", "SloConstraintConfig", "load_config", "config_from_dict", "ALGORITHMS", "CONFIG_DIR"]

ALGORITHMS = ("ppo", "maskable_ppo")
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True)
class BCConfig:
    """Behaviour-cloning warm start.

    Attributes:
        expert: policy name for ``carbon_gym.make_policy`` (``"milp"``, ``"ilp-state"``, ...) or
            ``"rr"`` (round-robin, always available).
        episodes: expert episodes collected (each on a training scenario and day).
        epochs: passes over the collected steps.
        batch_steps: observations (env steps) per gradient step.
        learning_rate: Adam step size.
        value_weight: weight of the critic's regression on the expert's normalised returns.
    """

    expert: str = "milp"
    episodes: int = 4
    epochs: int = 20
    batch_steps: int = 8
    learning_rate: float = 1e-3
    value_weight: float = 0.5


@dataclass(frozen=True)
class DaggerConfig:
    """Class-level imitation of an expert with DAgger (:func:`train.imitate.run_dagger`; needs
    ``set_policy.classes``). Run with ``carbon-gym train imitate --config ...``.

    Attributes:
        expert: expert policy name (``carbon_gym.make_policy``).
        scenarios: imitation scenarios (each with its own ``env.max_pending``; default: the
            config's ``scenarios``).
        overrides: scenario overrides of the imitation and validation episodes.
        expert_episodes: round-0 episodes where the expert acts (the last one validates the fit).
        rounds: DAgger rounds after round 0 (the learner acts, the expert labels).
        episodes_per_round: episodes per DAgger round.
        epochs: passes over the aggregated data after each round.
        batch_steps: env steps per gradient step.
        learning_rate: Adam step size of round 0, times ``lr_decay`` per round.
        lr_decay: learning-rate factor per round.
        rollout_mode: how the learner acts in DAgger rounds (``sample`` / ``systematic`` / ``argmax``).
        eval_mode: how it acts on the validation episodes.
        val_scenarios: validation scenarios (default: ``scenarios``).
        val_start_utc: validation start (default: the training-time evaluation day, held out).
        val_starts: validation starts (held-out days, not the test days of ``carbon-gym train
            evaluate``): the first is ``val_start_utc`` (or its default), the others the next ones
            of the same held-out sequence; every validation scenario runs on every start.
        val_seed: world seed of the validation episodes.
        violation_weight: pp of reduction charged per pp of violations above the expert's.
        aggregate_weight: weight of the aggregate loss (per-step shares of requests and prompt
            tokens per datacenter vs the expert's; ``train.imitate._loss``) added to the
            cross-entropy.
        capacity_weight: weight of the capacity head's cross-entropy (the expert's powered
            servers per datacenter at its capacity decisions; ``set_policy.capacity_head`` and
            ``capacity.control = "agent"`` in the overrides).
    """

    expert: str = "facility-milp"
    scenarios: tuple[str, ...] = ()
    overrides: dict[str, Any] = field(default_factory=lambda: {"duration_s": 60})
    expert_episodes: int = 6
    rounds: int = 4
    episodes_per_round: int = 3
    epochs: int = 20
    batch_steps: int = 16
    learning_rate: float = 2e-3
    lr_decay: float = 0.8
    rollout_mode: str = "sample"
    eval_mode: str = "sample"
    val_scenarios: tuple[str, ...] = ()
    val_start_utc: str | None = None
    val_starts: int = 1
    val_seed: int = 12345
    violation_weight: float = 2.0
    aggregate_weight: float = 0.0
    capacity_weight: float = 1.0


@dataclass(frozen=True)
class SloConstraintConfig:
    """A p99-aware SLO constraint for PPO from reward (:mod:`train.lagrangian`): a Lagrange
    multiplier per MLPerf target (TTFT, TPOT), raised by dual ascent while the rollouts' share of
    completed requests over that target exceeds ``budget``.

    Attributes:
        budget: allowed share of completed requests over each target (MLPerf's p99 criterion is
            0.01; the default keeps half of it as a margin for rollout-to-run noise).
        lr: dual step per rollout, in multiplier units per unit of ``rate / budget - 1``.
        init_lambda: multipliers at the start (reward units per step at twice the budget).
        max_lambda: upper clip of the multipliers.
    """

    budget: float = 0.005
    lr: float = 0.5
    init_lambda: float = 1.0
    max_lambda: float = 100.0


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation during training (domain scalars in TensorBoard).

    Attributes:
        scenario: scenario of the evaluation episode (default: the first training scenario).
        every_timesteps: evaluate when this many timesteps passed since the last evaluation
            (0 = never during training; once at the end is always done unless ``final`` is false).
        seed: world seed of the evaluation episode.
        start_utc: carbon start of the evaluation episode; default: the first held-out day.
        final: evaluate once more at the end of training.
    """

    scenario: str | None = None
    every_timesteps: int = 0
    seed: int = 12345
    start_utc: str | None = None
    final: bool = True


@dataclass(frozen=True)
class TrainConfig:
    """One training run (see the module docstring)."""

    name: str
    algorithm: str
    scenarios: tuple[str, ...]
    overrides: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    n_envs: int = 1
    total_timesteps: int = 1024
    torch_threads: int = 1
    heldout_every_days: int = 4
    ppo: dict[str, Any] = field(default_factory=dict)
    set_policy: dict[str, Any] = field(default_factory=dict)
    vec_normalize: dict[str, Any] = field(default_factory=dict)
    bc: BCConfig | None = None
    dagger: DaggerConfig | None = None
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint_every_timesteps: int = 0
    keep_checkpoints: int = 2
    source: str = ""
    #: Set-policy checkpoint (``.npz``) whose weights the PPO model starts from (instead of
    #: ``[bc]``); its network settings must equal ``[set_policy]``'s.
    init_checkpoint: str | None = None
    #: Timesteps at the start of PPO during which only the critic (``SetNetwork.value_head``)
    #: learns, the actor frozen: a warm-started actor is not moved by advantages from an
    #: untrained critic. Counted in ``total_timesteps``; needs ``init_checkpoint`` or ``[bc]``.
    critic_warmup_timesteps: int = 0
    #: ``[slo_constraint]``: the Lagrangian SLO constraint on the PPO reward (None: the env's
    #: reward as it is).
    slo_constraint: SloConstraintConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON-serialisable)."""
        d = asdict(self)
        d["scenarios"] = list(self.scenarios)
        return d

    def digest(self) -> str:
        """Short hash of the settings that define the run (not ``source``, not ``total_timesteps``)."""
        d = self.to_dict()
        d.pop("source", None)
        d.pop("total_timesteps", None)
        for key in ("critic_warmup_timesteps", "slo_constraint"):
            if not d.get(key):  # their defaults leave the digests of earlier runs as they were
                d.pop(key, None)
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


_TOP = {
    "name", "algorithm", "scenarios", "scenario", "overrides", "seed", "n_envs", "total_timesteps",
    "torch_threads", "heldout_every_days", "critic_warmup_timesteps", "ppo", "set_policy", "vec_normalize", "bc", "dagger", "eval", "checkpoint",
    "init_checkpoint", "slo_constraint",
}
_SET_POLICY = {"hidden", "logprob_reduction", "classes", "demand_features", "load_feedback", "capacity_head"}
_VECNORM = {"reward", "clip_reward", "gamma"}
_CHECKPOINT = {"every_timesteps", "keep"}


def _check_keys(section: str, got: Mapping[str, Any], allowed: set[str], source: str) -> None:
    extra = sorted(set(got) - allowed)
    if extra:
        raise ConfigError(f"{section}{extra[0]}", "unknown key", allowed=sorted(allowed), source=source)


def _pos_int(field_name: str, v: Any, source: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ConfigError(field_name, f"must be an integer >= {minimum}, got {v!r}", source=source)
    return int(v)


def _slo_constraint(raw: Any, source: str) -> SloConstraintConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("slo_constraint", "must be a table (budget, lr, init_lambda, max_lambda)", source=source)
    _check_keys("slo_constraint.", raw, set(SloConstraintConfig.__dataclass_fields__), source)
    vals: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"slo_constraint.{key}", f"must be a finite number, got {value!r}", source=source)
        vals[key] = float(value)
    c = SloConstraintConfig(**vals)
    if not 0.0 < c.budget < 1.0:
        raise ConfigError("slo_constraint.budget", f"must be a share in (0, 1), got {c.budget!r}", source=source)
    if c.lr <= 0.0:
        raise ConfigError("slo_constraint.lr", f"must be > 0, got {c.lr!r}", source=source)
    if c.init_lambda < 0.0 or c.max_lambda < c.init_lambda:
        raise ConfigError("slo_constraint.init_lambda", f"need 0 <= init_lambda <= max_lambda, got {c.init_lambda!r} "
                          f"and {c.max_lambda!r}", source=source)
    return c


def _dagger_config(raw: Any, set_policy: Mapping[str, Any], source: str) -> DaggerConfig:
    """The checked ``[dagger]`` section."""
    dg = dict(raw)
    _check_keys("dagger.", dg, set(DaggerConfig.__dataclass_fields__), source)
    for k in ("scenarios", "val_scenarios"):
        if k in dg:
            dg[k] = tuple([dg[k]] if isinstance(dg[k], str) else dg[k])
    dagger = DaggerConfig(**dg)
    _pos_int("dagger.expert_episodes", dagger.expert_episodes, source)
    _pos_int("dagger.rounds", dagger.rounds, source, minimum=0)
    _pos_int("dagger.episodes_per_round", dagger.episodes_per_round, source)
    _pos_int("dagger.epochs", dagger.epochs, source, minimum=0)
    _pos_int("dagger.batch_steps", dagger.batch_steps, source)
    _pos_int("dagger.val_starts", dagger.val_starts, source)
    for k in ("rollout_mode", "eval_mode"):
        if getattr(dagger, k) not in ("sample", "systematic", "argmax"):
            raise ConfigError(f"dagger.{k}", f"unknown mode {getattr(dagger, k)!r}", allowed=["sample", "systematic", "argmax"], source=source)
    if not set_policy.get("classes"):
        raise ConfigError("dagger", "class-level imitation needs set_policy.classes = true (or a table of bins)", source=source)
    if not (isinstance(dagger.capacity_weight, (int, float)) and dagger.capacity_weight >= 0):
        raise ConfigError("dagger.capacity_weight", f"must be a number >= 0, got {dagger.capacity_weight!r}", source=source)
    return dagger


def _ppo_start_checks(raw: Mapping[str, Any], algo: str, overrides: Mapping[str, Any], set_policy: Mapping[str, Any],
                      bc: BCConfig | None, source: str) -> str | None:
    """The checked ``init_checkpoint`` (or None), and the capacity head's requirements: the
    capacity action (``capacity.control = "agent"``), MaskablePPO and no ``[bc]``."""
    init = raw.get("init_checkpoint")
    if init is not None:
        if not isinstance(init, str) or not init:
            raise ConfigError("init_checkpoint", f"must be the path of a set-policy checkpoint (.npz), got {init!r}", source=source)
        if algo != "maskable_ppo" or bc is not None:
            raise ConfigError("init_checkpoint", "starts the set policy's PPO from a checkpoint: algorithm must be "
                              "'maskable_ppo', without [bc]", source=source)
    if set_policy.get("capacity_head"):
        cap = overrides.get("capacity")
        control = overrides.get("capacity.control", cap.get("control") if isinstance(cap, Mapping) else None)
        if control != "agent":
            raise ConfigError("set_policy.capacity_head", "the capacity head decides the servers of the capacity action: "
                              "set overrides 'capacity.control' = 'agent' (trained by [dagger], carbon-gym train imitate, "
                              "or fine-tuned by MaskablePPO)", allowed=["agent"], source=source)
        if bc is not None:
            raise ConfigError("bc", "behaviour cloning does not train the capacity head: start PPO from a DAgger "
                              "checkpoint (init_checkpoint)", source=source)
        if algo != "maskable_ppo":
            raise ConfigError("set_policy.capacity_head", "needs algorithm 'maskable_ppo'", source=source)
    return init


def config_from_dict(raw: Mapping[str, Any], *, source: str = "") -> TrainConfig:
    """Validate a parsed TOML mapping into a :class:`TrainConfig`."""
    _check_keys("", raw, _TOP, source)
    algo = raw.get("algorithm", "maskable_ppo")
    if algo not in ALGORITHMS:
        raise ConfigError("algorithm", f"unknown algorithm {algo!r}", allowed=list(ALGORITHMS), source=source)
    if "scenarios" in raw and "scenario" in raw:
        raise ConfigError("scenario", "give either 'scenario' or 'scenarios', not both", source=source)
    scen = raw.get("scenarios", raw.get("scenario", "dev"))
    scen = [scen] if isinstance(scen, str) else list(scen)
    if not scen or not all(isinstance(s, str) and s for s in scen):
        raise ConfigError("scenarios", f"must be a non-empty list of scenario names or paths, got {scen!r}", source=source)
    overrides = raw.get("overrides", {})
    if not isinstance(overrides, Mapping):
        raise ConfigError("overrides", "must be a table of dotted-key scenario overrides", source=source)
    set_policy = dict(raw.get("set_policy", {}))
    _check_keys("set_policy.", set_policy, _SET_POLICY, source)
    vecnorm = dict(raw.get("vec_normalize", {}))
    _check_keys("vec_normalize.", vecnorm, _VECNORM, source)
    ckpt = dict(raw.get("checkpoint", {}))
    _check_keys("checkpoint.", ckpt, _CHECKPOINT, source)
    bc = None
    if "bc" in raw:
        b = dict(raw["bc"])
        _check_keys("bc.", b, set(BCConfig.__dataclass_fields__), source)
        bc = BCConfig(**b)
        _pos_int("bc.episodes", bc.episodes, source)
        _pos_int("bc.epochs", bc.epochs, source, minimum=0)
        _pos_int("bc.batch_steps", bc.batch_steps, source)
        if algo != "maskable_ppo":
            raise ConfigError("bc", "behaviour cloning warm-starts the set policy: algorithm must be 'maskable_ppo'", source=source)
    dagger = _dagger_config(raw["dagger"], set_policy, source) if "dagger" in raw else None
    init = _ppo_start_checks(raw, algo, overrides, set_policy, bc, source)
    ev = dict(raw.get("eval", {}))
    _check_keys("eval.", ev, set(EvalConfig.__dataclass_fields__), source)
    evc = EvalConfig(**ev)
    _pos_int("eval.every_timesteps", evc.every_timesteps, source, minimum=0)
    ppo = dict(raw.get("ppo", {}))
    for bad in ("env", "policy", "tensorboard_log", "seed"):
        if bad in ppo:
            raise ConfigError(f"ppo.{bad}", "is set by the training workflow, not the config", source=source)
    slo = _slo_constraint(raw["slo_constraint"], source) if "slo_constraint" in raw else None
    cfg = TrainConfig(
        name=str(raw.get("name", Path(source).stem if source else "run")),
        algorithm=algo,
        scenarios=tuple(scen),
        overrides=dict(overrides),
        seed=_pos_int("seed", raw.get("seed", 0), source, minimum=0),
        n_envs=_pos_int("n_envs", raw.get("n_envs", 1), source),
        total_timesteps=_pos_int("total_timesteps", raw.get("total_timesteps", 1024), source, minimum=0),
        torch_threads=_pos_int("torch_threads", raw.get("torch_threads", 1), source),
        heldout_every_days=_pos_int("heldout_every_days", raw.get("heldout_every_days", 4), source, minimum=2),
        ppo=ppo,
        set_policy=set_policy,
        vec_normalize=vecnorm,
        bc=bc,
        dagger=dagger,
        eval=evc,
        checkpoint_every_timesteps=_pos_int("checkpoint.every_timesteps", ckpt.get("every_timesteps", 0), source, minimum=0),
        keep_checkpoints=_pos_int("checkpoint.keep", ckpt.get("keep", 2), source),
        source=source,
        init_checkpoint=init,
        critic_warmup_timesteps=_pos_int("critic_warmup_timesteps", raw.get("critic_warmup_timesteps", 0), source, minimum=0),
        slo_constraint=slo,
    )
    if cfg.critic_warmup_timesteps and (algo != "maskable_ppo" or (init is None and bc is None)):
        raise ConfigError("critic_warmup_timesteps", "trains the set policy's critic alone before PPO moves a warm-started "
                          "actor: needs algorithm 'maskable_ppo' and init_checkpoint or [bc]", source=source)
    return cfg


def load_config(path_or_name: str | Path, overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """Load a config file (a path, or the name of a file in ``train/configs/`` without ``.toml``).

    ``overrides`` replaces top-level keys (e.g. ``{"total_timesteps": 256}``).
    """
    from carbon_gym._toml import load_toml

    p = Path(path_or_name)
    if not p.exists():
        cand = CONFIG_DIR / f"{path_or_name}.toml"
        if not cand.exists():
            shipped = sorted(x.stem for x in CONFIG_DIR.glob("*.toml"))
            raise ConfigError("config", f"no such config file {str(path_or_name)!r}", allowed=shipped)
        p = cand
    raw = dict(load_toml(p))
    if overrides:
        raw.update(overrides)
    return config_from_dict(raw, source=str(p))
