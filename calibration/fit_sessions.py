"""Fit the synthetic session generator (:mod:`carbon_gym.sessions`) to a Mooncake-format trace.

    python -m calibration.fit_sessions                 # print the fitted values vs the trace
    python -m calibration.fit_sessions --write         # ... and write carbon_gym/data/params/sessions/mooncake_conv.toml
    python -m calibration.fit_sessions --trace path/to/trace.jsonl --out my_params.toml --write

Method: sessions, turns and system prompts are inferred from the trace's prefix chains
(:func:`carbon_gym.mooncake.infer_sessions`). Then

* turns per session: the empirical pmf of requests per inferred session;
* first message: ``prompt - system prompt tokens`` of first turns (system prompt tokens =
  its full blocks x the block size: the trace cannot say how far into the next block it runs);
* follow-up message: ``prompt - parent prompt - parent output`` of later turns, at least 1 token
  (the share at or below 0 is printed: the trace's next prompt sometimes omits part of the answer);
* output: every request's output length; think time: arrival gap from the parent turn, s;
* system prompts: one per distinct inferred system prefix, its tokens and share of sessions;

each length / time as an empirical quantile table (inverse-CDF sampling with interpolation).
The per-engine capacity entries of an existing output file are kept (they are measured with the
simulator: ``python eval/measure_session_capacity.py --write``). A generated hour is compared
with the trace (means, the prefix-block reuse) to show what the fit keeps and loses.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

LEVELS = np.unique(np.concatenate([np.linspace(0.0, 1.0, 201), [0.999, 0.9999]]))
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "carbon_gym" / "data" / "params" / "sessions" / "mooncake_conv.toml"


def block_reuse(hash_lists: list, prompt_tokens: np.ndarray, block_tokens: int) -> float:
    """Share of full prompt blocks whose whole prefix appeared in an earlier request: the hit rate
    of an unbounded prefix cache fed the requests in order (chained keys)."""
    seen: set[int] = set()
    hit = total = 0
    for h, p in zip(hash_lists, prompt_tokens.tolist()):
        k = 0
        full = p // block_tokens
        matching = True
        for x in h[:full]:
            k = hash((k, x))
            if matching and k in seen:
                hit += 1
            else:
                matching = False
                seen.add(k)
        total += full
    return hit / total if total else float("nan")


def fit(trace_name: str, block_tokens: int, min_system_children: int) -> tuple[dict, dict]:
    from carbon_gym.mooncake import infer_sessions, load_prefix_trace
    from carbon_gym.sessions import trace_session_stats

    tr = load_prefix_trace(trace_name, block_tokens)
    inf = infer_sessions(tr, min_system_children)
    first = inf.parent < 0
    sys_tokens = inf.system_blocks * block_tokens
    later = ~first
    par = inf.parent[later]
    raw_followup = tr.prompt_tokens[later] - tr.prompt_tokens[par] - tr.output_tokens[par]
    think = tr.arrival_s[later] - tr.arrival_s[par]
    _, sizes = np.unique(inf.session, return_counts=True)
    pmf = np.bincount(sizes)[1:] / sizes.size
    sessions_first = np.flatnonzero(first)
    sp = inf.system_prompt[sessions_first]
    n_sp = int(sp.max()) + 1 if (sp >= 0).any() else 0
    sp_tokens = [int(np.median(sys_tokens[sessions_first][sp == k])) for k in range(n_sp)]
    sp_counts = np.array([np.count_nonzero(sp == k) for k in range(n_sp)], dtype=np.float64)
    q = lambda a: np.quantile(np.asarray(a, dtype=np.float64), LEVELS)  # noqa: E731
    params = {
        "turns_pmf": pmf,
        "first_message_tokens": np.maximum(1.0, q(tr.prompt_tokens[first] - sys_tokens[first])),
        "followup_message_tokens": np.maximum(1.0, q(np.maximum(1, raw_followup))),
        "output_tokens": q(tr.output_tokens),
        "think_time_s": np.maximum(0.0, q(think)),
        "system_prompt_tokens": sp_tokens,
        "system_prompt_weights": (sp_counts / sp_counts.sum()).tolist() if n_sp else [],
        "system_prompt_share": float(np.mean(sp >= 0)),
    }
    stats = trace_session_stats(tr, inf)
    stats["followup_le_0_share"] = float(np.mean(raw_followup <= 0)) if raw_followup.size else float("nan")
    stats["block_reuse"] = block_reuse(tr.hash_lists(), tr.prompt_tokens, block_tokens)
    stats["span_s"] = float(tr.arrival_s[-1])
    return params, stats


def _fmt(a: np.ndarray, digits: int) -> str:
    return "[" + ", ".join(f"{x:.{digits}f}" if digits else f"{int(round(x))}" for x in a) + "]"


def to_toml(params: dict, stats: dict, trace_name: str, block_tokens: int, keep_capacity: str) -> str:
    lines = [
        "# Synthetic session generator parameters (carbon_gym.sessions), fitted to a Mooncake-format trace.",
        "# Written by: python -m calibration.fit_sessions --write  (method: calibration/fit_sessions.py).",
        f"# Trace statistics: {int(stats['requests'])} requests, {int(stats['sessions'])} inferred sessions, "
        f"mean turns {stats['mean_turns']:.3f}, block reuse {stats['block_reuse']:.4f}.",
        f'trace = "{trace_name}"',
        f"block_tokens = {block_tokens}",
        "",
        "[turns]",
        f"pmf = {_fmt(params['turns_pmf'], 8)}",
        "",
        "[system_prompts]",
        f"tokens = {params['system_prompt_tokens']}",
        f"weights = {_fmt(np.asarray(params['system_prompt_weights']), 8) if params['system_prompt_weights'] else '[]'}",
        f"share = {params['system_prompt_share']:.6f}",
        "",
        "[quantiles]",
        f"levels = {_fmt(LEVELS, 6)}",
        f"first_message_tokens = {_fmt(params['first_message_tokens'], 1)}",
        f"followup_message_tokens = {_fmt(params['followup_message_tokens'], 1)}",
        f"output_tokens = {_fmt(params['output_tokens'], 1)}",
        f"think_time_s = {_fmt(params['think_time_s'], 3)}",
        "",
        "[trace_stats]",
        *(f"{k} = {v!r}" for k, v in stats.items()),
    ]
    text = "\n".join(lines) + "\n"
    if keep_capacity:
        text += "\n" + keep_capacity.strip() + "\n"
    return text


def _capacity_section(path: Path) -> str:
    if not path.exists():
        return ""
    text = path.read_text()
    i = text.find("\n[capacity.")
    return text[i:] if i >= 0 else ""


def generated_stats(params_path: str, rate_per_s: float, duration_s: float, seed: int, block_tokens: int) -> dict:
    """Statistics of ``duration_s`` of generated sessions (one region, no context cap)."""
    from carbon_gym.sessions import SessionWorkload, batch_session_stats, load_session_params

    p = load_session_params(params_path)
    w = SessionWorkload(p, rate_per_s=rate_per_s, seed=seed, max_context_tokens=None, block_tokens=block_tokens)
    b = w.arrivals_between(0.0, duration_s)
    st = batch_session_stats(b, p.system_prompt_tokens[0] if p.system_prompt_tokens else 0)
    st["block_reuse"] = block_reuse(b.prefix_hashes, b.prompt_tokens, block_tokens)
    return st


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default="mooncake-conv", help="packaged name or a Mooncake-format .jsonl[.gz] path")
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--min-system-children", type=int, default=32)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check-seed", type=int, default=0, help="seed of the generated comparison")
    args = ap.parse_args(argv)
    params, stats = fit(args.trace, args.block_tokens, args.min_system_children)
    text = to_toml(params, stats, args.trace, args.block_tokens, _capacity_section(args.out))
    target = args.out
    if args.write:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(f"wrote {target}")
    else:
        import tempfile

        target = Path(tempfile.mkdtemp()) / "params.toml"
        target.write_text(text)
    # compare: the trace's own rate, over a trace-long span after a span of warm-up
    rate = stats["requests"] / stats["span_s"]
    gen = generated_stats(str(target), rate, 4 * stats["span_s"], args.check_seed, args.block_tokens)
    print(f"| statistic | trace ({args.trace}) | generated (seed {args.check_seed}, {4 * stats['span_s']:.0f} s) |")
    print("|---|---|---|")
    for k in ("requests", "sessions", "mean_turns", "mean_prompt_tokens", "mean_output_tokens", "mean_first_message_tokens",
              "mean_followup_message_tokens", "median_think_time_s", "mean_think_time_s", "system_prompt_share", "block_reuse"):
        print(f"| {k} | {stats[k]:.4g} | {gen[k]:.4g} |")
    print(f"| followup <= 0 share (clipped to 1) | {stats['followup_le_0_share']:.4g} | - |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
