"""The ``carbon-gym`` command-line tool.

Subcommands (each imports what it needs only when it runs, so ``carbon-gym --help`` is fast)::

    carbon-gym eval --policies rr,greedy,milp --scenarios dev --seeds 3 [--preset quick]
    carbon-gym eval --policies rr,milp --scenarios dev-fault   # + fault report vs the same runs without faults
    carbon-gym experiment headline|milp-vs-ilp|predictor|polling|tradeoff|bound|diurnal|capacity|sessions|generalise|learned-capacity|all  (or a..k)
    carbon-gym report results/headline            # regenerate RESULTS.md from a headline run
    carbon-gym report results --section capacity   # rewrite only RESULTS.md's capacity section
    carbon-gym report results --section slo        # ... or only the "Within the SLO" section (eval/slo_report.py)
    carbon-gym scenarios                           # shipped scenarios
    carbon-gym policies                            # policy names (carbon_gym.registry)
    carbon-gym calibrate ...                       # calibration.cli
    carbon-gym train ...                           # train.cli
    carbon-gym bench env|solvers|soak|sim|faults|compare|capacity ...   # eval/bench_*.py, fault_report, ...

Bad arguments (unknown policy or scenario, bad seeds, malformed ``--set``) print one line naming
the argument and the allowed values and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any, Sequence

PROG = "carbon-gym"
EXIT_USAGE = 2

EXPERIMENT_ALIASES = {
    "a": "headline",
    "b": "milp-vs-ilp",
    "c": "predictor",
    "d": "polling",
    "e": "tradeoff",
    "f": "bound",
    "g": "diurnal",
    "h": "capacity",
    "i": "sessions",
    "j": "generalise",
    "k": "learned-capacity",
}
EXPERIMENTS = tuple(EXPERIMENT_ALIASES.values())
#: ``report --section`` choices: headline, capacity, then eval.report.TABLE_SECTIONS (kept here so --help needs no heavy import; a test
#: holds them equal)
SECTIONS = ("headline", "capacity", "slo", "milp-vs-ilp", "predictor", "polling", "tradeoff", "bound", "diurnal", "sessions", "generalise",
            "learned-capacity")
# `carbon-gym bench NAME ...` -> the module whose main(argv) runs it
BENCHES = {
    "env": "eval.bench_env",
    "solvers": "eval.bench_solvers",
    "soak": "eval.bench_soak",
    "sim": "eval.bench_sim",
    "faults": "eval.fault_report",
    "compare": "eval.compare",
    "capacity": "eval.measure_capacity",
}


class UsageError(Exception):
    """A bad command-line argument: printed as one line, exit status 2."""

    def __init__(self, argument: str, message: str, allowed: Sequence[str] | None = None):
        text = f"{argument}: {message}"
        if allowed is not None:
            text += f" (allowed: {', '.join(map(str, allowed))})"
        super().__init__(text)


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line (no usage dump) and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if message.startswith("argument ") and ": " in message:
            name, _, rest = message[len("argument "):].partition(": ")
            raise UsageError(name, rest)
        raise UsageError(self.prog, message)


# ----------------------------------------------------------------------------------------------
# argument parsing helpers


def parse_value(text: str) -> Any:
    """``--set`` values: JSON (numbers, true/false, lists, quoted strings) or a bare string."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return text


def parse_assignments(items: Sequence[str] | None, argument: str) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": 1, "c": "x"}``; UsageError naming ``argument`` otherwise."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(argument, f"expected KEY=VALUE, got {item!r}")
        out[key.strip()] = parse_value(value)
    return out


def parse_policy_args(items: Sequence[str] | None) -> dict[str, dict[str, Any]]:
    """``["milp.slo_weight=10"]`` -> ``{"milp": {"slo_weight": 10}}`` (policy names as in tables).
    ``POLICY.trust=...`` is refused (:class:`UsageError`): ``--trust-checkpoint`` is the one way
    to admit a pickled checkpoint, so a policy argument cannot bypass its check."""
    from carbon_gym.registry import canonical_policy_name

    out: dict[str, dict[str, Any]] = {}
    for key, value in parse_assignments(items, "--policy-arg").items():
        pol, dot, kw = key.rpartition(".") if key.count(".") > 1 else key.partition(".")
        if not dot or not kw or not pol:
            raise UsageError("--policy-arg", f"expected POLICY.KEY=VALUE, got {key!r}")
        if kw == "trust":  # (trusting a pickled checkpoint is the command line's own flag, not a policy argument)
            raise UsageError("--policy-arg", f"{key!r}: trust is not a policy argument; pass --trust-checkpoint "
                             "to admit a pickled checkpoint you trust", ["--trust-checkpoint"])
        out.setdefault(canonical_policy_name(pol), {})[kw] = value
    return out


def parse_seeds(n: int | None, seed_list: str | None, start: int = 0) -> list[int]:
    """``--seeds N`` -> ``[start, ..., start+N-1]``; ``--seed-list 0,4,7`` -> that list."""
    if seed_list:
        seeds = []
        for part in seed_list.split(","):
            part = part.strip()
            try:
                seeds.append(int(part))
            except ValueError:
                raise UsageError("--seed-list", f"expected comma-separated integers, got {part!r}") from None
        if any(s < 0 for s in seeds):
            raise UsageError("--seed-list", "seeds must be >= 0")
        if len(set(seeds)) != len(seeds):
            raise UsageError("--seed-list", "seeds must be distinct")
        return seeds
    if n is None:
        n = 1
    if n < 1:
        raise UsageError("--seeds", f"must be a positive number of seeds, got {n}")
    if start < 0:
        raise UsageError("--seed-start", f"must be >= 0, got {start}")
    return list(range(start, start + n))


def _int(text: str, minimum: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
    return v


def _positive_int(text: str) -> int:
    """An integer >= 1 (``--seeds``, ``--workers``)."""
    return _int(text, 1)


def _nonnegative_int(text: str) -> int:
    """An integer >= 0 (``--seed-start``)."""
    return _int(text, 0)


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    return v


def split_list(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def resolve_policies(text: str, trust: bool = False) -> list[str]:
    """Comma list (or ``all``) -> validated policy names as in tables, ``rr`` first (the
    reference). Names are checked by the policy registry (:func:`carbon_gym.registry.check_policy_name`:
    registered names and aliases, ``learned:<checkpoint.npz>`` with an existing file,
    importable ``package.module:Class``) before any run starts; a learned checkpoint must be
    pickle-free unless ``trust`` (``--trust-checkpoint``)."""
    from carbon_gym import registry
    from carbon_gym.errors import ConfigError

    from eval.tables import REFERENCE_POLICY

    names = split_list(text)
    if not names:
        raise UsageError("--policies", "no policy given", registry.available_policies() + ["all"])
    from eval.runner import policy_labels, split_label

    out: list[str] = []
    for text in names:
        if text == "all":
            out.extend(p for p in registry.default_policies() if p not in out)
            continue
        given, n = split_label(text)
        if ":" in n and registry.split_prefix(n) is None:
            _import_from_cwd()
        try:
            name = registry.check_policy_name(n)
        except ConfigError as exc:
            text_ = str(exc).removeprefix(f"{exc.field}: ")
            if exc.allowed is not None and isinstance(exc.allowed, list):
                raise UsageError("--policies", text_.split(" (allowed: ")[0], [*exc.allowed, "all"]) from None
            raise UsageError("--policies", text_) from None
        if _is_learned(name):
            _check_checkpoint(name, trust)
        name = f"{given}={name}" if given else name
        if name not in out:
            out.append(name)
    if REFERENCE_POLICY not in out:
        print(f"{PROG}: note: adding '{REFERENCE_POLICY}' (the reference for 'vs rr')", file=sys.stderr)
        out.insert(0, REFERENCE_POLICY)
    try:
        labels = policy_labels(out)
    except ConfigError as exc:
        raise UsageError("--policies", str(exc).removeprefix(f"{exc.field}: ")) from None
    relabelled = [f"{p} as {labels[p]!r}" for p in out if labels[p] != _stem_label(p)]
    if relabelled:
        print(f"{PROG}: note: checkpoints with the same file name are told apart by their paths: {', '.join(relabelled)} "
              "(or name them: NAME=learned:<path>)", file=sys.stderr)
    return out


def _stem_label(p: str) -> str:
    from eval.runner import policy_label

    return policy_label(p)


def _import_from_cwd() -> None:
    """Make modules in the working directory importable for ``--policies package.module:Class``,
    as ``python -m`` does (the ``carbon-gym`` script does not); spawned worker processes
    inherit the path."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _is_learned(name: str) -> bool:
    """``learned``, ``learned:<path>`` or ``ppo:<path>`` (train's registered names; also as
    ``NAME=...``)."""
    from carbon_gym.registry import split_prefix

    from eval.runner import split_label

    name = split_label(name)[1]
    pre = split_prefix(name)
    return name == "learned" or (pre is not None and pre[0] in ("learned", "ppo"))


def _check_checkpoint(name: str, trust: bool = False) -> None:
    """A learned policy's checkpoint must exist (and train/ must be installed), and be pickle-free
    unless ``trust`` (``--trust-checkpoint``)."""
    try:
        from train.checkpoint import require_trust
        from train.policy import SHIPPED_CHECKPOINT
    except ImportError:
        raise UsageError("--policies", f"{name!r} needs the training extra: pip install 'carbon-gym[train]'") from None
    from eval.runner import split_label

    name = split_label(name)[1]
    path = str(SHIPPED_CHECKPOINT) if name == "learned" else name.split(":", 1)[1]
    if not os.path.isfile(path):
        raise UsageError("--policies", f"{name!r}: no checkpoint at {path!r}")
    from carbon_gym.errors import CarbonGymError

    try:
        require_trust(path, trust)
    except CarbonGymError as exc:
        raise UsageError("--trust-checkpoint" if getattr(exc, "field", "") == "trust" else "--policies", f"{name!r}: {exc}") from None


def _with_trust(policy_kwargs: dict[str, dict[str, Any]], policies: Sequence[str], trust: bool) -> dict[str, dict[str, Any]]:
    """``policy_kwargs`` with ``trust=True`` for every learned policy when ``--trust-checkpoint``."""
    from eval.runner import split_label

    if trust:
        for p in policies:
            if _is_learned(p):
                given, name = split_label(p)
                key = given or name
                policy_kwargs[key] = {**policy_kwargs.get(key, policy_kwargs.get("learned", {})), "trust": True}
    return policy_kwargs


def list_scenarios() -> list[str]:
    from carbon_gym.scenario import list_scenarios as _list

    return list(_list())


def resolve_scenarios(text: str) -> list[str]:
    """Comma list of shipped names or TOML paths -> validated list."""
    names = split_list(text)
    shipped = list_scenarios()
    if not names:
        raise UsageError("--scenarios", "no scenario given", shipped)
    for n in names:
        if n in shipped:
            continue
        if n.endswith(".toml") or os.sep in n:
            if not os.path.isfile(n):
                raise UsageError("--scenarios", f"no such scenario file {n!r}")
            continue
        raise UsageError("--scenarios", f"unknown scenario {n!r}", shipped + ["<path/to/file.toml>"])
    return names


def check_scenarios(scenarios: Sequence[str], overrides: dict[str, Any]) -> None:
    """Load every scenario with the overrides before any run starts: a bad ``--set`` fails
    here, once, as a usage error. Scenario warnings (e.g. provisional load levels) become one
    ``note:`` line each."""
    import warnings

    from carbon_gym.errors import CarbonGymError
    from carbon_gym.scenario import load_scenario

    seen: set[str] = set()
    for scen in scenarios:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                load_scenario(scen, overrides)
            except CarbonGymError as exc:
                raise UsageError("--set" if overrides else "--scenarios", f"{scen}: {exc}") from None
        for w in caught:
            text = str(w.message)
            if text not in seen:
                seen.add(text)
                print(f"{PROG}: note: {text}", file=sys.stderr)


def note_preset(preset: str | None, window_s: float | None, experiment: bool = False, stream: Any = None) -> None:
    """Say what the preset's numbers are (the quick one's are not results)."""
    from eval.experiments import PRESETS

    if preset is None or window_s is not None:
        return
    if preset == "quick" and not experiment:
        print(f"{PROG}: note: --preset quick: {PRESETS['quick'].note}", file=stream or sys.stderr)
    elif preset in PRESETS:
        print(f"{PROG}: note: preset {preset}: {PRESETS[preset].note}", file=stream or sys.stderr)


def note_starts(scenarios: Sequence[str], overrides: dict[str, Any], spread: bool, stream: Any = None) -> None:
    """Say where the episodes start on the carbon trace: each scenario's own ``carbon.start_utc``
    (kept), or starts spread over the year that replace it (one per seed)."""
    import warnings

    from carbon_gym.scenario import load_scenario

    if "carbon.start_utc" in overrides:
        print(f"{PROG}: note: every episode starts at --set carbon.start_utc={overrides['carbon.start_utc']}", file=stream or sys.stderr)
        return
    starts = []
    for scen in dict.fromkeys(scenarios):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            starts.append(f"{scen}: {load_scenario(scen, overrides).carbon.start_utc}")
    if spread:
        print(f"{PROG}: note: --spread-starts: each seed starts at its own day and hour of the carbon year, replacing the "
              f"scenario's carbon.start_utc ({'; '.join(starts)}); the starts are in config.json", file=stream or sys.stderr)
    else:
        print(f"{PROG}: note: episodes start at the scenario's carbon.start_utc ({'; '.join(starts)}); --spread-starts "
              "spreads the seeds over the carbon year", file=stream or sys.stderr)


# ----------------------------------------------------------------------------------------------
# parser


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="carbon_gym: carbon-aware geo-distributed LLM serving — evaluation, experiments, calibration, training.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    ev = sub.add_parser("eval", help="run a policy x scenario x seed matrix and write tables", description="Run every policy on every scenario and seed (common random numbers) and write summary.csv/.md, per-run, per-step and per-request records and TensorBoard scalars.")
    add_run_args(ev, out_default=os.path.join("runs", "eval"))
    ev.add_argument("--policies", default="all", help="comma list of policy names (see `carbon-gym policies`; also learned:<checkpoint.npz> and package.module:Class), or 'all' (default); rr is always added as the reference")
    ev.add_argument("--scenarios", default="dev", help="comma list of shipped scenario names or TOML paths (default: dev)")
    ev.add_argument("--no-fault-baseline", action="store_true", help="do not also run scenarios with [[faults]] without them (no fault report)")
    ev.add_argument("--spread-starts", action="store_true", help="start each seed at its own point of the carbon year (day x hour, a low-discrepancy sequence) instead of the scenario's carbon.start_utc, which eval keeps by default")

    ex = sub.add_parser("experiment", help="run one of the study's experiments (a-k) and write its table and figure")
    ex.add_argument("name", help="headline|milp-vs-ilp|predictor|polling|tradeoff|bound|diurnal|capacity|sessions|generalise|learned-capacity|all, or a..k")
    add_run_args(ex, out_default="results")
    ex.add_argument("--models", default=None, help="comma list of models to include (llama8b,qwen7b,mixtral8x7b; default all)")
    ex.add_argument("--loads", default=None, help="comma list of loads (low,moderate,high; default per experiment)")
    ex.add_argument("--policies", default=None, help="override the experiment's policy list (comma list)")
    ex.add_argument("--scenarios", default=None, help="run on these scenarios instead of models x loads (comma list of names or TOML paths)")
    ex.add_argument("--all-requests", action="store_true", help="write per-request records of every run (default: only where a figure needs them)")
    ex.add_argument("--heldout-seeds", action="store_true", help="experiments headline, milp-vs-ilp, tradeoff, predictor, capacity: each scenario runs its own first N fresh held-out starts "
                    "(python -m eval.heldout_seeds: days the shipped learned agent never saw), N = --seeds or the preset's; "
                    "instead of one --seed-list for every scenario")
    ex.add_argument("--training-seeds", action="store_true", help="the same experiments: each scenario runs its own first N training starts "
                    "(python -m eval.heldout_seeds --training: never a held-out day), N = --seeds or the preset's; where knobs are chosen")
    ex.add_argument("--periods", default=None, metavar="S1,S2", help="experiment polling: the polling periods to sweep, s (comma list, each > 0; default the preset's 0.1,0.25,0.5,1,2,4,8)")

    rp = sub.add_parser("report", help="write RESULTS.md from a finished headline run (and other experiments found next to it)")
    rp.add_argument("results_dir", nargs="?", default="results", help="directory holding headline/ (and the other experiments), default results")
    rp.add_argument("--out", default="RESULTS.md", help="Markdown file to write (default RESULTS.md)")
    rp.add_argument("--figures", default=os.path.join("docs", "figures"), help="where to copy the figures RESULTS.md shows")
    rp.add_argument("--command", dest="run_command", default=None, help="the command that produced the run (default: from its config.json)")
    rp.add_argument("--replot", action="store_true", help="redraw the headline figures from its files first")
    rp.add_argument("--force", action="store_true", help="replace an existing --out file and figures (default: refuse)")
    rp.add_argument("--section", choices=SECTIONS, default=None, help="rewrite only this experiment's section of --out in place, "
                    "from <results_dir>/<section> (with its cost-table row, the totals and its study claim; the rest of the file "
                    "is kept, no headline run needed; headline: the preamble, how it was produced, the headline and the sections "
                    "derived from its runs): " + ", ".join(SECTIONS))

    sub.add_parser("scenarios", help="list the shipped scenarios")
    sub.add_parser("policies", help="list the policy names (registered names, learned:<path>, package.module:Class)")
    sub.add_parser("calibrate", help="fit latency/power parameters and write the validation report (calibration.cli)", add_help=False)
    sub.add_parser("train", help="train learned policies (train.cli)", add_help=False)
    bp = sub.add_parser("bench", help="benchmarks and reports: " + ", ".join(BENCHES) + " (e.g. bench faults = fault report)", add_help=False)
    bp.add_argument("name", nargs="?")
    return p


def add_run_args(p: argparse.ArgumentParser, *, out_default: str) -> None:
    g = p.add_argument_group("matrix")
    g.add_argument("--seeds", type=_positive_int, default=None, help="number of seeds (default: 3 for eval; preset-dependent for experiments)")
    g.add_argument("--seed-start", type=_nonnegative_int, default=0, help="first seed (default 0)")
    g.add_argument("--seed-list", default=None, help="explicit comma list of seeds (overrides --seeds)")
    g.add_argument("--preset", default=None, help="quick (60 s from an empty cluster, with the drain: a smoke test, not a result; the experiments' default) or full (a 600 s steady-state window after a 300 s burn-in, 8 starts over the year)")
    g.add_argument("--duration-s", type=_float, default=None, help="simulated seconds per episode, from an empty cluster and with the drain (overrides the preset)")
    g.add_argument("--window-s", type=_float, default=None, help="measure a steady-state window of this many simulated seconds (after --warmup-s of burn-in, not counted; no drain)")
    g.add_argument("--warmup-s", type=_float, default=None, help=f"burn-in before the window, simulated but not counted (default {300:g} s with --window-s; a multiple of the polling period)")
    g.add_argument("--set", dest="overrides", action="append", metavar="KEY=VALUE", help="scenario override, e.g. --set polling_period_s=2 (repeatable; any dotted scenario field)")
    g.add_argument("--policy-arg", dest="policy_args", action="append", metavar="POLICY.KEY=VALUE", help="policy keyword argument, e.g. --policy-arg milp.violation_penalty_g=10 (repeatable)")
    g.add_argument("--knob", dest="knobs", action="append", metavar="POLICY=V1,V2", help="experiment tradeoff: run this knob-driven policy's frontier at these values (its default added), e.g. --knob planner=0.6,0.9 (repeatable; default: eval/frontiers.py KNOBS)")
    g.add_argument("--no-carbon-start", action="store_true", help="keep the scenario's own carbon.start_utc (experiments spread their starts over the year by default; eval keeps it unless --spread-starts)")
    g.add_argument("--trust-checkpoint", action="store_true", help="admit learned checkpoints in stable-baselines3's pickled .zip format (loading one can run its author's code)")
    r = p.add_argument_group("execution and output")
    r.add_argument("--out", default=None, help=f"output directory (default {out_default}; when that already holds results, the next free "
                   f"{out_default}-2, -3, ... is used, and said; an explicit --out holding results is refused unless --overwrite)")
    r.add_argument("--overwrite", action="store_true", help="replace the results already in --out")
    p.set_defaults(out_default=out_default)
    r.add_argument("--workers", type=_positive_int, default=None, help="local worker processes (default: all cores)")
    r.add_argument("--ray-address", default=None, help="run on Ray: 'local' for a local instance, 'auto' or ray://host:port for a cluster")
    r.add_argument("--tensorboard", default=None, metavar="DIR", help="TensorBoard log dir (default: <--out>/tensorboard, or <--out>/<experiment>/tensorboard, so it is "
                   "numbered or refused with --out; eval's default runs/eval/tensorboard sits beside training's runs/train: `tensorboard --logdir runs/` shows both); "
                   "a DIR already holding event files is refused unless --overwrite")
    r.add_argument("--no-tensorboard", action="store_true", help="do not write TensorBoard scalars")
    r.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="record files format (default parquet; csv if pyarrow is missing)")
    r.add_argument("--no-requests", action="store_true", help="do not write per-request records")
    r.add_argument("--no-plots", action="store_true", help="skip figures")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")


# ----------------------------------------------------------------------------------------------
# commands


def holds_results(path: str) -> bool:
    """Whether ``path`` holds the results of an earlier run (its ``config.json``)."""
    return os.path.isfile(os.path.join(path, "config.json"))


def resolve_out(args: argparse.Namespace, names: Sequence[str] | None = None) -> str:
    """The output directory: an explicit ``--out`` (refused when it already holds results,
    unless ``--overwrite``), else the default, or its next free version ``<default>-2``, ... when
    the default holds results (said on stderr). ``names``: the experiments to run, each writing
    ``<out>/<name>`` (then those subdirectories are what must be free)."""
    def taken(d: str) -> list[str]:
        dirs = [os.path.join(d, n) for n in names] if names else [d]
        return [x for x in dirs if holds_results(x)]

    if args.out is not None:
        _check_out_dir(args.out)
        busy = taken(args.out)
        if busy and not args.overwrite:
            raise UsageError("--out", f"{busy[0]!r} already holds results (its config.json); choose another --out, or "
                             "--overwrite to replace them")
        return args.out
    base = args.out_default
    out, k = base, 1
    while taken(out) and not args.overwrite:
        k += 1
        out = f"{base}-{k}"
    if out != base:
        print(f"{PROG}: note: {base!r} holds earlier results; writing to {out!r} (--out DIR to choose, --overwrite to "
              f"replace {base!r})", file=sys.stderr)
    return out


def _check_out_dir(out: str) -> None:
    """UsageError for an ``--out`` that cannot be a results directory: empty, a NUL byte, an
    existing file, or a directory that cannot be created or written."""
    if not out.strip():
        raise UsageError("--out", "empty path; give a directory (e.g. --out results/run1)")
    if "\x00" in out:
        raise UsageError("--out", f"the path holds a NUL byte: {out!r}")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError("--out", f"{out!r} is an existing file; give a directory")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UsageError("--out", f"cannot create directory {out!r}: {e.strerror or e}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise UsageError("--out", f"directory {out!r} is not writable")


def tensorboard_dir(args: argparse.Namespace, out: str, experiment: str | None = None) -> str | None:
    """TensorBoard root of a run (or of ``experiment`` in ``out``): under ``--tensorboard``
    (``<DIR>/<experiment>``), else ``<out>[/<experiment>]/tensorboard``, so that two ``--out``
    directories never share a TensorBoard run (``--out`` itself is numbered or refused when it
    holds results); None with ``--no-tensorboard``. A ``--tensorboard`` directory already
    holding event files is refused unless ``--overwrite`` (then each run's own folder is
    replaced, :func:`eval.writers.write_tensorboard`)."""
    if args.no_tensorboard:
        return None
    if not args.tensorboard:
        return os.path.join(out, *([experiment] if experiment else []), "tensorboard")
    root = os.path.join(args.tensorboard, experiment) if experiment else args.tensorboard
    if not args.overwrite and _holds_events(root):
        raise UsageError("--tensorboard", f"{root!r} already holds TensorBoard event files (an earlier run's); "
                         "choose another --tensorboard, leave it out (then <--out>/tensorboard), or --overwrite")
    return root


def _holds_events(root: str) -> bool:
    """Whether any TensorBoard event file lies under ``root``."""
    for _dir, _sub, files in os.walk(root):
        if any(f.startswith("events.out.tfevents") for f in files):
            return True
    return False


def _check_run_args(args: argparse.Namespace) -> None:
    if args.duration_s is not None and not (args.duration_s > 0):
        raise UsageError("--duration-s", f"must be > 0, got {args.duration_s}")
    if args.window_s is not None and not (args.window_s > 0):
        raise UsageError("--window-s", f"must be > 0, got {args.window_s}")
    if args.warmup_s is not None and not (args.warmup_s >= 0):
        raise UsageError("--warmup-s", f"must be >= 0, got {args.warmup_s}")
    if args.duration_s is not None and (args.window_s is not None or args.warmup_s is not None):
        raise UsageError("--duration-s", "is an episode without a window: give it or --window-s / --warmup-s, not both")
    if args.warmup_s is not None and args.window_s is None and (args.preset or "") != "full":
        raise UsageError("--warmup-s", "needs a measurement window: --window-s (or --preset full)")
    from eval.experiments import PRESETS

    if args.preset is not None and args.preset not in PRESETS:
        raise UsageError("--preset", f"unknown preset {args.preset!r}", list(PRESETS))


def cmd_eval(args: argparse.Namespace, argv: Sequence[str]) -> int:
    _check_run_args(args)
    if args.knobs:
        raise UsageError("--knob", "sizes a trade-off frontier: use it with carbon-gym experiment tradeoff", ["experiment tradeoff"])
    seeds = parse_seeds(args.seeds if args.seeds is not None else 3, args.seed_list, args.seed_start)
    policies = resolve_policies(args.policies, args.trust_checkpoint)
    scenarios = resolve_scenarios(args.scenarios)
    overrides = parse_assignments(args.overrides, "--set")
    policy_kwargs = _with_trust(parse_policy_args(args.policy_args), policies, args.trust_checkpoint)
    from carbon_gym.registry import split_prefix

    from eval import experiments

    from eval.runner import split_label

    bare = [split_label(p)[1] for p in policies]
    given = [g for g in (split_label(p)[0] for p in policies) if g]
    prefixes = {pre[0] for pre in map(split_prefix, bare) if pre is not None}
    for pol in policy_kwargs:
        if pol not in bare and pol not in prefixes and pol not in given:  # (``learned.x=`` also serves ``learned:<path>``)
            raise UsageError("--policy-arg", f"policy {pol!r} is not in --policies", policies)
    check_scenarios(scenarios, experiments.preset_overrides(args.preset, args.duration_s, overrides, window_s=args.window_s, warmup_s=args.warmup_s))
    note_preset(args.preset, args.window_s)
    spread = bool(args.spread_starts) and not args.no_carbon_start
    note_starts(scenarios, overrides, spread)
    out = resolve_out(args)
    tb = tensorboard_dir(args, out)

    res = experiments.eval_matrix(
        scenarios=scenarios,
        policies=policies,
        seeds=seeds,
        preset=args.preset,
        duration_s=args.duration_s,
        overrides=overrides,
        policy_kwargs=policy_kwargs,
        out=out,
        workers=args.workers,
        ray_address=args.ray_address,
        tensorboard=tb,
        fmt=args.format,
        requests=not args.no_requests,
        plots=not args.no_plots,
        progress=not args.no_progress,
        carbon_start=spread,
        fault_baseline=not args.no_fault_baseline,
        command=_command_line(argv),
        window_s=args.window_s,
        warmup_s=args.warmup_s,
    )
    from eval.tables import fault_markdown, summary_markdown

    print(summary_markdown(res.summary), end="")
    print(f"wrote {os.path.join(out, 'summary.md')}" + (f"; TensorBoard: tensorboard --logdir {tb}" if tb else ""))
    _print_estimate_errors(res.executed.runs, out)
    if res.fault_report is not None:
        pairs = ", ".join(f"{k} vs {v}" for k, v in res.twins.items())
        print(f"\nfault report ({pairs}: the same policies, seeds and episode starts without the faults; "
              "w/o = without; means over seeds):\n")
        print(fault_markdown(res.fault_report), end="")
        print(f"wrote {os.path.join(out, 'fault_report.md')}")
    return 0


def _print_estimate_errors(runs: Any, out: str) -> None:
    """The schedulers' TTFT / TPOT estimate errors (eval.estimate_error), printed and written to
    ``estimate_error.md``; nothing when no policy logged estimates."""
    from eval.estimate_error import error_lines, error_markdown, error_table

    table = error_table(runs)
    if table is None:
        return
    print("\nestimate error (predicted - realised, ms; quantiles over each run's measured requests, mean over seeds; "
          "negative = optimistic):")
    for line in error_lines(table):
        print(line)
    from eval.writers import write_text

    path = write_text(os.path.join(out, "estimate_error.md"), "# Estimate error: predicted - realised (ms)\n\n" + error_markdown(table))
    print(f"wrote {path}")


def _experiment_scenarios(names: Sequence[str], args: argparse.Namespace) -> tuple[list[str] | None, list[str] | None]:
    """``--scenarios`` of an experiment: (what it runs, the shipped scenarios to check). Experiment
    generalise takes its tests' scenario labels."""
    if names == ["generalise"] and args.scenarios:  # the experiment's tests, by their scenario labels
        from eval.generalise_experiment import TESTS

        labels = [t.label for t in TESTS]
        for n in split_list(args.scenarios):
            if n not in labels:
                raise UsageError("--scenarios", f"experiment generalise has no test {n!r}", labels)
        scenarios = split_list(args.scenarios)
        checked = list(dict.fromkeys(t.scenario for t in TESTS if t.label in scenarios))
    else:
        scenarios = resolve_scenarios(args.scenarios) if args.scenarios else None
        checked = scenarios
    return scenarios, checked


def _experiment_notes(names: Sequence[str], args: argparse.Namespace) -> None:
    """The notes (stderr) on windows and starts that an experiment chooses itself."""
    if "capacity" in names and args.window_s is None:
        from eval.capacity_report import CAPACITY_WARMUP_S, CAPACITY_WINDOW_S

        print(f"{PROG}: note: experiment capacity measures its own window ({CAPACITY_WINDOW_S:g} s after a {CAPACITY_WARMUP_S:g} s "
              "burn-in; 60 s after 60 s under --preset quick) and one start unless --seeds; --window-s / --warmup-s set another",
              file=sys.stderr)
    if "learned-capacity" in names:
        from eval.learned_capacity_experiment import DEFAULT_SCENARIO, STARTS, WARMUP_S, WINDOW_S

        print(f"{PROG}: note: experiment learned-capacity runs its own starts and window: the first {STARTS} fresh held-out "
              f"days of {DEFAULT_SCENARIO}, {WINDOW_S:g} s after a {WARMUP_S:g} s burn-in (one start, 20 s after 10 s under "
              "--preset quick); --seeds N takes the first N such days, --window-s another window", file=sys.stderr)
    if "generalise" in names:
        print(f"{PROG}: note: experiment generalise runs its own starts: 20 fresh held-out days for its main test, 2 starts "
              "for each other test (one under --preset quick); --seeds N sets how many for every test", file=sys.stderr)
    if args.no_carbon_start:
        print(f"{PROG}: note: --no-carbon-start: every episode starts at its scenario's own carbon.start_utc", file=sys.stderr)
    else:
        print(f"{PROG}: note: each seed starts at its own day and hour of the carbon year (the same for every policy), "
              "replacing the scenarios' carbon.start_utc; --no-carbon-start keeps it", file=sys.stderr)


def parse_periods(text: str | None) -> tuple[float, ...] | None:
    """``--periods``: a comma list of polling periods, s (each a number > 0, no repeats)."""
    if text is None:
        return None
    out: list[float] = []
    for part in split_list(text):
        try:
            v = float(part)
        except ValueError:
            raise UsageError("--periods", f"{part!r} is not a number of seconds") from None
        if not (v > 0) or v != v or v == float("inf"):
            raise UsageError("--periods", f"each period must be a finite number > 0 s, got {part!r}")
        if v in out:
            raise UsageError("--periods", f"period {part!r} is given twice")
        out.append(v)
    if not out:
        raise UsageError("--periods", "needs at least one period, e.g. --periods 0.1,0.5,1,2,4")
    return tuple(out)


def _check_seed_pools(args: argparse.Namespace, names: Sequence[str], allowed: Sequence[str]) -> None:
    """``--heldout-seeds`` / ``--training-seeds``: one of them, on one experiment that takes them,
    without explicit seeds (UsageError otherwise)."""
    if args.heldout_seeds and args.training_seeds:
        raise UsageError("--training-seeds", "and --heldout-seeds exclude each other: knobs are chosen on training starts, results reported on held-out ones")
    for flag, on, kind in (("--heldout-seeds", args.heldout_seeds, "held-out"), ("--training-seeds", args.training_seeds, "training")):
        if not on:
            continue
        if len(names) != 1 or names[0] not in allowed:
            raise UsageError(flag, f"gives each scenario of experiments {', '.join(allowed)} its own {kind} "
                             f"starts; {args.name!r} chooses its starts itself or takes --seeds / --seed-list", list(allowed))
        if args.seed_list or args.seed_start:
            raise UsageError(flag, "chooses the seeds itself: give --seeds N (how many per scenario), not --seed-list or --seed-start")


def cmd_experiment(args: argparse.Namespace, argv: Sequence[str]) -> int:
    _check_run_args(args)
    name = EXPERIMENT_ALIASES.get(args.name, args.name)
    names = list(EXPERIMENTS) if name == "all" else [name]
    if names[0] not in EXPERIMENTS:
        raise UsageError("experiment", f"unknown experiment {args.name!r}", list(EXPERIMENTS) + ["all"] + list(EXPERIMENT_ALIASES))
    periods = parse_periods(args.periods)
    if periods is not None and "polling" not in names:
        raise UsageError("--periods", f"sets the polling sweep's periods: use it with experiment polling, not {args.name!r}", ["polling", "d"])
    seeds = parse_seeds(args.seeds, args.seed_list, args.seed_start) if (args.seeds or args.seed_list) else None
    from eval import experiments

    _check_seed_pools(args, names, experiments.HELDOUT_EXPERIMENTS)

    models = split_list(args.models) or None
    if models:
        for m in models:
            if m not in experiments.MODELS:
                raise UsageError("--models", f"unknown model {m!r}", experiments.MODELS)
    loads = split_list(args.loads) or None
    if loads:
        for ld in loads:
            if ld not in experiments.LOADS:
                raise UsageError("--loads", f"unknown load {ld!r}", experiments.LOADS)
    policies = resolve_policies(args.policies, args.trust_checkpoint) if args.policies else None
    scenarios, checked = _experiment_scenarios(names, args)
    check_scenarios(checked or [f"{(models or experiments.MODELS)[0]}-{(loads or ['moderate'])[0]}"], experiments.preset_overrides(args.preset or "quick", args.duration_s, parse_assignments(args.overrides, "--set"), window_s=args.window_s, warmup_s=args.warmup_s))
    note_preset(args.preset or "quick", args.window_s, experiment=True)
    _experiment_notes(names, args)
    if getattr(args, "knobs", None):
        from eval.frontiers import knob_values_from_cli, set_knob_values

        set_knob_values(knob_values_from_cli(args.knobs))
    out = resolve_out(args, names)
    tensorboards = {n: tensorboard_dir(args, out, n) for n in names}  # (refused before any experiment runs)
    for n in names:
        table = experiments.run_experiment(
            n,
            out=os.path.join(out, n),
            preset=args.preset or "quick",
            seeds=seeds,
            models=models,
            loads=loads,
            policies=policies,
            scenarios=scenarios,
            duration_s=args.duration_s,
            overrides=parse_assignments(args.overrides, "--set"),
            policy_kwargs=_with_trust(parse_policy_args(args.policy_args), policies or [], args.trust_checkpoint),
            workers=args.workers,
            ray_address=args.ray_address,
            tensorboard=tensorboards[n],
            fmt=args.format,
            requests=False if args.no_requests else ("all" if args.all_requests else True),
            plots=not args.no_plots,
            progress=not args.no_progress,
            carbon_start=not args.no_carbon_start,
            command=_command_line(argv),
            window_s=args.window_s,
            warmup_s=args.warmup_s,
            polling_s=periods,
            heldout_seeds=args.heldout_seeds,
            training_seeds=args.training_seeds,
        )
        print(f"## {n}\n")
        print(table, end="")
        print(f"wrote {os.path.join(out, n)}")
    return 0


def cmd_report(args: argparse.Namespace, argv: Sequence[str]) -> int:
    from eval import experiments

    if args.section == "capacity":
        if not os.path.isfile(os.path.join(args.results_dir, "capacity", "runs.csv")):
            raise UsageError("results_dir", f"{os.path.join(args.results_dir, 'capacity', 'runs.csv')!r} not found; run "
                             f"`carbon-gym experiment capacity --out {args.results_dir}` first")
        from eval.report import write_capacity_costs

        print(f"wrote the capacity section of {write_capacity_costs(args.results_dir, out=args.out)} (and its rows of the cost table)")
        return 0
    if args.section == "slo":
        from eval.slo_report import write_slo_section

        try:
            print(f"wrote the SLO section of {write_slo_section(args.results_dir, out=args.out)}")
        except FileNotFoundError as exc:
            raise UsageError("results_dir", str(exc)) from None
        return 0
    if args.section is not None:
        from eval.report import write_headline_section, write_section

        from carbon_gym.errors import ConfigError

        try:
            if args.section == "headline":
                path, what = write_headline_section(args.results_dir, out=args.out, figures_dir=args.figures, command=args.run_command), "the headline's sections"
            else:
                path, what = write_section(args.results_dir, args.section, out=args.out, figures_dir=args.figures), f"the {args.section} section"
        except ConfigError as exc:
            raise UsageError("--out" if exc.field == "out" else exc.field, str(exc).removeprefix(f"{exc.field}: ")) from None
        print(f"wrote {what} of {path}")
        return 0

    if not os.path.isdir(os.path.join(args.results_dir, "headline")):
        raise UsageError("results_dir", f"{os.path.join(args.results_dir, 'headline')!r} not found; run `carbon-gym experiment headline --out {args.results_dir}` first")
    if args.replot:
        experiments.replot_headline(os.path.join(args.results_dir, "headline"))
    from eval.report import write_results_md

    from carbon_gym.errors import ConfigError

    try:
        path = write_results_md(args.results_dir, out=args.out, figures_dir=args.figures, command=args.run_command,
                                overwrite=args.force)
    except ConfigError as exc:
        if exc.field in ("out", "figures"):
            raise UsageError(f"--{exc.field}", str(exc).removeprefix(f"{exc.field}: ").replace("allow replacing them (carbon-gym report --force)", "--force to replace them").replace("allow replacing it (carbon-gym report --force)", "--force to replace it")) from None
        raise
    print(f"wrote {path}")
    return 0


def cmd_scenarios(args: argparse.Namespace, argv: Sequence[str]) -> int:
    try:
        from carbon_gym.scenario import describe_scenario  # type: ignore[attr-defined]
    except ImportError:
        describe_scenario = None
    for name in list_scenarios():
        line = name
        if describe_scenario is not None:
            try:
                line = f"{name:24s} {describe_scenario(name)}"
            except Exception:  # noqa: BLE001 - a listing must not fail on one bad description
                pass
        print(line)
    return 0


def cmd_policies(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """One line per registered policy (name, aliases, what it is), then the prefix and
    ``module:Class`` forms."""
    from carbon_gym import registry

    rows = []
    for name in registry.available_policies():
        info = registry.policy_info(name)
        alias = f"(= {', '.join(info.aliases)})" if info.aliases else ""
        rows.append((name, alias, info.doc + ("" if info.in_all else "   (not in 'all')")))
    for prefix in registry.available_prefixes():
        info = registry.policy_info(prefix + ":x")
        rows.append((f"{prefix}:<checkpoint.npz>", "", info.doc))
    rows.append(("package.module:Class", "", "a policy class of your own on the Python path (built as Class(env, **kw) or Class(**kw))"))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    for name, alias, doc in rows:
        print(f"{name:{w0}s}  {alias:{w1}s}  {doc}".rstrip())
    return 0


def _delegate(module: str, argv: Sequence[str], what: str) -> int:
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (exc.name == module or module.startswith(exc.name + ".")):
            print(f"{PROG}: error: {what} is not available in this installation ({module} not found)", file=sys.stderr)
            return EXIT_USAGE
        raise
    main_fn = getattr(mod, "main", None)
    if main_fn is None:
        print(f"{PROG}: error: {module} has no main()", file=sys.stderr)
        return EXIT_USAGE
    rc = main_fn(list(argv))
    return rc if isinstance(rc, int) else 0


def _command_line(argv: Sequence[str]) -> str:
    return " ".join([PROG] + [shlex.quote(a) for a in argv])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``carbon-gym``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "calibrate":
        return _delegate("calibration.cli", argv[1:], "calibration")
    if argv and argv[0] == "train":
        return _delegate("train.cli", argv[1:], "training")
    if argv and argv[0] == "bench":
        if len(argv) < 2 or argv[1] not in BENCHES:
            got = argv[1] if len(argv) > 1 else None
            print(f"{PROG}: error: bench: {'missing benchmark name' if got is None else f'unknown benchmark {got!r}'} (allowed: {', '.join(BENCHES)})", file=sys.stderr)
            return EXIT_USAGE
        return _delegate(BENCHES[argv[1]], argv[2:], f"benchmark {argv[1]!r}")
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE
        handler = {
            "eval": cmd_eval,
            "experiment": cmd_experiment,
            "report": cmd_report,
            "scenarios": cmd_scenarios,
            "policies": cmd_policies,
        }[args.command]
        return handler(args, argv)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - documented errors become one line, bugs keep their traceback
        return _report_error(exc)


def _report_error(exc: BaseException) -> int:
    from carbon_gym.errors import CarbonGymError, ConfigError

    from eval.backends import RunFailed

    if isinstance(exc, RunFailed):
        if exc.kind in ("config", "carbon_gym"):
            print(f"{PROG}: error: {exc.spec.run_id}: {exc.original}", file=sys.stderr)
            return EXIT_USAGE if exc.kind == "config" else 1
        tb = getattr(exc.original, "traceback", "")
        if tb:
            print(tb, file=sys.stderr, end="")
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, CarbonGymError):
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ConfigError) else 1
    if isinstance(exc, RuntimeError) and "pip install" in str(exc):
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    raise exc


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
