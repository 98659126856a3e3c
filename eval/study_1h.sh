#!/usr/bin/env bash
# The study run committed in RESULTS.md (issue 21, item 7). Its default stages (a e h i) take about
# 1.5 h of wall time on a 2-core machine (178 CPU-minutes measured: a 70, e 35, h 68, i 5; about an
# hour before stage h grew from one start to eight); the other stages below are what else RESULTS.md
# shows, each with its cost. Steady-state windows (>= 600 s after a burn-in that is not counted), the
# recalibrated physics, load levels as fractions of the cluster-level capacity (issue 20, item 4).
#
#   a  headline  3 models x low/moderate/high load, 600 s window after 300 s, 8 starts: rr, greedy-cap,
#                planner, milp and the shipped learned agent; each scenario's starts are its own first 8
#                seeds on days the agent never saw (--heldout-seeds: python -m eval.heldout_seeds); the
#                lower bound per start comes from these runs; 360 runs, 70 CPU-minutes (40 min of wall time)
#                (ilp-state is compared with the MILP in stage b)
#   h  capacity  capacity control (engines sleep, servers power off): llama8b-low, llama8b-moderate,
#                mixtral8x7b-low, 900 s window after 300 s, each scenario its headline's 8 starts
#                (--heldout-seeds): rr always on vs rr / planner / ilp-state with the reactive autoscaler,
#                rr with the carbon-aware one, the MILP deciding capacity (and its own always-on run);
#                192 runs, 68 CPU-minutes (35 min of wall time)
#   e  tradeoff  llama8b-moderate, the same 8 starts and window: the planner at utilisation 0.6, 0.7,
#                0.8 and 0.9 (default), the facility MILP at its utilisation cap max_prefill_share 0.3,
#                0.4 and 0.5 (default; its violation penalty hardly moves it), rr the reference: 4 and 3
#                points per frontier, compared at equal violation by interpolation (eval/frontiers.py
#                KNOBS has 6 values each); ~75 CPU-minutes
#   e2 tradeoff  mixtral8x7b-moderate, its headline starts (--heldout-seeds): the planner, the MILP and
#                greedy-cap (capacity_cap 0.6, 0.7, 0.8, 0.9) frontiers, into OUT/tradeoff-more (merged
#                into the trade-off section); 96 runs, 31 CPU-minutes
#   e3 tradeoff  llama8b-moderate, the same 8 starts: the learned agent's safety knob (headroom_penalty 0-40)
#                and round-robin with each autoscaler (rr+reactive target_util 0.4-0.75, rr+carbon-aware
#                dirty_cap_frac 0.1-1; capacity.control = agent), into OUT/tradeoff-capacity; 128 runs, 31 CPU-minutes
#   e4 tradeoff  llama8b-high, its headline starts: the planner, MILP and greedy-cap frontiers, into
#                OUT/tradeoff-high; 96 runs, 58 CPU-minutes
#   e5 tradeoff  qwen7b-moderate, its headline starts: the planner and MILP frontiers, into OUT/tradeoff-qwen
#   e6 tradeoff  the same on qwen7b-high, into OUT/tradeoff-qwen-high; 64 runs, 62 CPU-minutes
#   e7 tradeoff  llama8b-moderate, the same 8 starts: the rest of the 6 values per knob (planner 0.5, 1;
#                MILP 0.35, 0.45, 0.6) and the greedy-cap and ilp-cap frontiers (capacity_cap 0.5-1), into
#                OUT/tradeoff-full; 160 runs, 58 CPU-minutes
#   e8 tradeoff  mixtral8x7b-high, its headline starts: the planner, MILP and greedy-cap frontiers, into
#                OUT/tradeoff-mixtral-high; 96 runs, 41 CPU-minutes
#   e9 tradeoff  llama8b-low, its headline starts: the planner and MILP frontiers, into OUT/tradeoff-low;
#                64 runs, 16 CPU-minutes
#   e10 tradeoff llama8b-moderate, the same 8 starts: the MILP deciding capacity (--set capacity.control=agent:
#                `milp (capacity)`, rr always on) over max_prefill_share 0.3, 0.4, 0.5, into
#                OUT/tradeoff-milp-capacity; 32 runs, 13 CPU-minutes
#   e11 tradeoff the same with max_prefill_share 0.3 and its capacity cap capacity_util_cap 0.4, 0.5, 0.6
#                (--policy-arg points milp-s0.3-uU), into OUT/tradeoff-milp-capacity-cap; 32 runs, 12 CPU-minutes
#   i  sessions  multi-turn sessions with prefix caching (issue 23): 4 scenarios, 2 starts
#                (their load levels come from the sessions' own capacity file, so they did not move
#                with the cluster basis)
#
# More stages, not in the default set (each near or over the hour on its own):
#   g  diurnal   llama8b-diurnal, one 6 h window after a 10 min burn-in, its own carbon start
#                (2023-06-15 00:00 UTC): rr always on, planner+reactive and the MILP deciding
#                capacity (capacity.control = agent); 3 runs, 38 CPU-minutes (41 min of wall time on 2 cores
#                beside stage k: the MILP run is most of it)
#   j  generalise the learned agent vs the MILP (and rr) on data it never saw: 20 fresh held-out
#                days, the 2022 carbon year, llama8b-low / -high, 8 and 18 datacenters, two unseen
#                zones, three regions, a region outage (2 starts each), in one matrix (the earlier
#                generalise-regions and generalise-topologies matrices are its tests now); 108 runs
#   c  predictor the MILP with the output-length predictor vs oracle lengths on llama8b-moderate,
#                llama8b-high, qwen7b-moderate and mixtral8x7b-moderate, each its headline starts
#                (--heldout-seeds) and window (rr at each); 128 runs, 60 CPU-minutes
#   c2 predictor the MILP and ilp-state at low load (llama8b-, qwen7b-, mixtral8x7b-low), into
#                OUT/predictor-low (merged into the predictor section); 144 runs, 46 CPU-minutes
#   c3 predictor ilp-state at moderate load on the 3 models, into OUT/predictor-ilp; 96 runs, 50 CPU-minutes
#   d  polling   llama8b-moderate, the same 8 starts and window: rr and the MILP at polling periods
#                0.5, 1, 2 and 4 s (rr at each period the reference); 64 runs, ~90 CPU-minutes. At
#                0.1 s one MILP run with the whole branch-and-bound budget took ~30 CPU-minutes; the
#                budget is now a 1 s poll's share (FacilityConfig.bb_work_poll_s)
#   d3 polling   the MILP at 0.1 s with the whole 1 s branch-and-bound budget (bb_work_poll_s = 0.1: its
#                share is all of it), labelled milp-fullbb, on 2 of the 8 starts, into OUT/polling-fullbb
#   d2 polling   the short periods, 0.1, 0.25 and 0.5 s, same starts and window, into OUT/polling-short
#                (merged into the polling section); 48 runs, 100 CPU-minutes
#   d4 polling   the MILP with prefill_horizon_s = 1 (its per-poll prefill cap over 1 s, not one period),
#                labelled milp-h1, at 0.1 and 0.5 s, into OUT/polling-horizon; 32 runs, 25 CPU-minutes
#   d5 polling   the MILP's added-wait budget from the 25% and 50% quantile of the TTFT headroom (default
#                2%), milp-q25 / milp-q50, at 2 s, into OUT/polling-theta; 24 runs, 13 CPU-minutes
#   d6 polling   prefill_horizon_s = 0.2, 0.3, 0.5 at 0.1 s (milp-h02 / -h03 / -h05), into
#                OUT/polling-horizon-sweep; 32 runs, 81 CPU-minutes
#   f  bound     the clairvoyant heuristic (true lengths, all arrivals and carbon known, SLOs ignored)
#                against the lower bound on the headline's 8 starts and window (rr the reference; the
#                other policies' shares of the bound come from the headline's runs); 16 runs
#   b  milp-vs-ilp the facility MILP vs the per-request ILPs (load-blind ilp, ilp-cap with the static
#                capacity cap, state-aware ilp-state) on the 3 models x low and moderate load, each
#                scenario its headline starts (--heldout-seeds), the same window; 240 runs, 94 CPU-minutes
#   b2 milp-vs-ilp the same at llama8b-high (its headline starts), into OUT/milp-vs-ilp-high (merged into
#                the section); 40 runs
#   b3 milp-vs-ilp the same at qwen7b-high and mixtral8x7b-high, into OUT/milp-vs-ilp-high-more; 80 runs,
#                51 CPU-minutes
#   k  learned-capacity the capacity-aware agent (train/checkpoints/llama8b_capacity_set.npz) vs
#                the MILP deciding capacity, milp-mpc, rr+reactive and rr always on: llama8b-moderate,
#                20 fresh held-out days, 600 s windows; 100 runs, 42 CPU-minutes (40 min of wall time
#                beside stage g)
#
# Not in this run (too costly for 2 cores; the full matrix on a cluster is in README "On a Ray
# cluster"): 6-value frontiers beyond llama8b-moderate, frontiers at low load beyond llama8b-low,
# the capacity-deciding MILP's frontiers beyond llama8b-moderate.
#
# usage: bash eval/study_1h.sh [OUT] [STAGES]   (OUT defaults to results, STAGES to "a e h i";
#        "a b b2 b3 e e2 e3 e4 e5 e6 e7 e8 e9 e10 e11 h i c c2 c3 d d2 d3 d4 d5 d6 f g j k" for everything RESULTS.md shows; each stage's sections of RESULTS.md
#        are rewritten in place, carbon-gym report OUT --section <experiment>, the rest kept; without
#        a RESULTS.md the whole file is written from OUT)
set -euo pipefail
OUT=${1:-results}
STAGES=${2:-a e h i}
SEEDS=$(python -m eval.heldout_seeds --scenario llama8b-moderate --n 8)
for stage in $STAGES; do
  case $stage in
    a) carbon-gym experiment headline --preset full --models llama8b,qwen7b,mixtral8x7b --loads low,moderate,high \
         --policies rr,greedy-cap,planner,milp,learned:train/checkpoints/llama8b_set.npz \
         --heldout-seeds --out "$OUT" --workers 2 --no-tensorboard --no-progress ;;
    e) carbon-gym experiment tradeoff --preset full --scenarios llama8b-moderate --policies planner,milp \
         --knob planner=0.6,0.7,0.8 --knob milp=0.3,0.4 --seed-list "$SEEDS" --out "$OUT" --workers 2 --no-tensorboard --no-progress ;;
    e2) carbon-gym experiment tradeoff --preset full --scenarios mixtral8x7b-moderate --policies planner,milp,greedy-cap \
         --knob planner=0.6,0.7,0.8 --knob milp=0.3,0.4 --knob greedy-cap=0.6,0.7,0.8 --heldout-seeds \
         --out "$OUT/tradeoff-more" --workers 2 --no-tensorboard --no-progress ;;
    e3) carbon-gym experiment tradeoff --preset full --scenarios llama8b-moderate --policies learned:train/checkpoints/llama8b_set.npz,rr+reactive,rr+carbon-aware \
         --knob learned=0,5,10,40 --knob rr+reactive=0.4,0.5,0.7,0.75 --knob rr+carbon-aware=0.1,0.5,0.75,1 --seed-list "$SEEDS" \
         --out "$OUT/tradeoff-capacity" --workers 2 --no-tensorboard --no-progress ;;
    e4) carbon-gym experiment tradeoff --preset full --scenarios llama8b-high --policies planner,milp,greedy-cap \
         --knob planner=0.6,0.7,0.8 --knob milp=0.3,0.4 --knob greedy-cap=0.6,0.7,0.8 --heldout-seeds \
         --out "$OUT/tradeoff-high" --workers 2 --no-tensorboard --no-progress ;;
    e5) carbon-gym experiment tradeoff --preset full --scenarios qwen7b-moderate --policies planner,milp \
         --knob planner=0.6,0.7,0.8 --knob milp=0.3,0.4 --heldout-seeds --out "$OUT/tradeoff-qwen" --workers 2 --no-tensorboard --no-progress ;;
    e6) carbon-gym experiment tradeoff --preset full --scenarios qwen7b-high --policies planner,milp \
         --knob planner=0.6,0.7,0.8 --knob milp=0.3,0.4 --heldout-seeds --out "$OUT/tradeoff-qwen-high" --workers 2 --no-tensorboard --no-progress ;;
    e7) carbon-gym experiment tradeoff --preset full --scenarios llama8b-moderate --policies planner,milp,greedy-cap,ilp-cap \
         --knob planner=0.5,1.0 --knob milp=0.35,0.45,0.6 --knob greedy-cap=0.5,0.6,0.7,0.8,1.0 --knob ilp-cap=0.5,0.6,0.7,0.8,1.0 \
         --seed-list "$SEEDS" --out "$OUT/tradeoff-full" --workers 2 --no-tensorboard --no-progress ;;
    e8) carbon-gym experiment tradeoff --preset full --scenarios mixtral8x7b-high --policies planner,milp,greedy-cap \
         --knob planner=0.6,0.7,0.8 --knob milp=0.3,0.4 --knob greedy-cap=0.6,0.7,0.8 --heldout-seeds \
         --out "$OUT/tradeoff-mixtral-high" --workers 2 --no-tensorboard --no-progress ;;
    e9) carbon-gym experiment tradeoff --preset full --scenarios llama8b-low --policies planner,milp \
         --knob planner=0.6,0.7,0.8 --knob milp=0.3,0.4 --heldout-seeds --out "$OUT/tradeoff-low" --workers 2 --no-tensorboard --no-progress ;;
    b3) carbon-gym experiment milp-vs-ilp --preset full --models qwen7b,mixtral8x7b --loads high --heldout-seeds \
         --out "$OUT/milp-vs-ilp-high-more" --workers 2 --no-tensorboard --no-progress ;;
    b2) carbon-gym experiment milp-vs-ilp --preset full --models llama8b --loads high --heldout-seeds \
         --out "$OUT/milp-vs-ilp-high" --workers 2 --no-tensorboard --no-progress ;;
    d3) carbon-gym experiment polling --preset full --scenarios llama8b-moderate --policies milp-fullbb=milp \
         --policy-arg milp-fullbb.bb_work_poll_s=0.1 --periods 0.1 --seed-list 23,46 --out "$OUT/polling-fullbb" \
         --workers 2 --no-tensorboard --no-progress ;;
    d) carbon-gym experiment polling --preset full --scenarios llama8b-moderate --policies milp --periods 0.5,1,2,4 \
         --seed-list "$SEEDS" --out "$OUT" --workers 2 --no-tensorboard --no-progress ;;
    d2) carbon-gym experiment polling --preset full --scenarios llama8b-moderate --policies milp --periods 0.1,0.25,0.5 \
         --seed-list "$SEEDS" --out "$OUT/polling-short" --workers 2 --no-tensorboard --no-progress ;;
    d4) carbon-gym experiment polling --preset full --scenarios llama8b-moderate --policies milp-h1=milp \
         --policy-arg milp-h1.prefill_horizon_s=1 --periods 0.1,0.5 --seed-list "$SEEDS" --out "$OUT/polling-horizon" \
         --workers 2 --no-tensorboard --no-progress ;;
    d5) carbon-gym experiment polling --preset full --scenarios llama8b-moderate --policies milp-q25=milp,milp-q50=milp \
         --policy-arg milp-q25.ttft_budget_quantile=0.25 --policy-arg milp-q50.ttft_budget_quantile=0.5 --periods 2 \
         --seed-list "$SEEDS" --out "$OUT/polling-theta" --workers 2 --no-tensorboard --no-progress ;;
    d6) carbon-gym experiment polling --preset full --scenarios llama8b-moderate --policies milp-h02=milp,milp-h03=milp,milp-h05=milp \
         --policy-arg milp-h02.prefill_horizon_s=0.2 --policy-arg milp-h03.prefill_horizon_s=0.3 \
         --policy-arg milp-h05.prefill_horizon_s=0.5 --periods 0.1 --seed-list "$SEEDS" --out "$OUT/polling-horizon-sweep" \
         --workers 2 --no-tensorboard --no-progress ;;
    c2) carbon-gym experiment predictor --preset full --scenarios llama8b-low,qwen7b-low,mixtral8x7b-low --policies milp,ilp-state \
         --heldout-seeds --out "$OUT/predictor-low" --workers 2 --no-tensorboard --no-progress ;;
    c3) carbon-gym experiment predictor --preset full --scenarios llama8b-moderate,qwen7b-moderate,mixtral8x7b-moderate \
         --policies ilp-state --heldout-seeds --out "$OUT/predictor-ilp" --workers 2 --no-tensorboard --no-progress ;;
    h) carbon-gym experiment capacity --preset full --seeds 8 --heldout-seeds --out "$OUT" --overwrite --workers 2 --no-plots \
         --no-tensorboard --no-progress ;;
    e10) carbon-gym experiment tradeoff --preset full --scenarios llama8b-moderate --policies milp --knob milp=0.3,0.4 \
         --set capacity.control=agent --seed-list "$SEEDS" --out "$OUT/tradeoff-milp-capacity" --workers 2 --no-tensorboard --no-progress ;;
    e11) P=""; A=""
         for u in 0.4 0.5 0.6; do
           P="$P,milp-s0.3-u$u=milp"
           A="$A --policy-arg milp-s0.3-u$u.max_prefill_share=0.3 --policy-arg milp-s0.3-u$u.capacity_util_cap=$u"
         done
         # shellcheck disable=SC2086
         carbon-gym experiment tradeoff --preset full --scenarios llama8b-moderate --policies "${P#,}" $A \
           --set capacity.control=agent --seed-list "$SEEDS" --out "$OUT/tradeoff-milp-capacity-cap" --workers 2 --no-tensorboard --no-progress ;;
    i) carbon-gym experiment sessions --preset full --out "$OUT" --workers 2 --no-tensorboard --no-progress ;;
    g) carbon-gym experiment diurnal --preset full --no-carbon-start --policies rr,planner+reactive,milp --out "$OUT" \
         --workers 2 --no-requests --no-plots --no-tensorboard --no-progress ;;
    j) carbon-gym experiment generalise --preset full --out "$OUT" --workers 2 --no-tensorboard --no-plots --no-progress ;;
    c) carbon-gym experiment predictor --preset full --scenarios llama8b-moderate,llama8b-high,qwen7b-moderate,mixtral8x7b-moderate \
         --policies milp --heldout-seeds --out "$OUT" --overwrite --workers 2 --no-tensorboard --no-progress ;;
    f) carbon-gym experiment bound --preset full --scenarios llama8b-moderate --policies rr \
         --seed-list "$SEEDS" --out "$OUT" --workers 2 --no-tensorboard --no-progress ;;
    b) carbon-gym experiment milp-vs-ilp --preset full --models llama8b,qwen7b,mixtral8x7b --loads low,moderate \
         --heldout-seeds --out "$OUT" --workers 2 --no-tensorboard --no-progress ;;
    k) carbon-gym experiment learned-capacity --preset full --out "$OUT" --workers 2 --no-tensorboard --no-progress ;;
    *) echo "unknown stage $stage (a, b, b2, b3, c, c2, c3, d, d2, d3, d4, d5, d6, e, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, f, g, h, i, j, k)" >&2; exit 2 ;;
  esac
done
if [ ! -f RESULTS.md ]; then
  carbon-gym report "$OUT"                              # the whole file, from every matrix under OUT
else                                                    # each stage's section, in place (the others kept)
  for stage in $STAGES; do
    case $stage in
      b|b2|b3) carbon-gym report "$OUT" --section milp-vs-ilp ;;  c|c2|c3) carbon-gym report "$OUT" --section predictor ;;
      d|d2|d3|d4|d5|d6) carbon-gym report "$OUT" --section polling ;;   e|e2|e3|e4|e5|e6|e7|e8|e9|e10|e11) carbon-gym report "$OUT" --section tradeoff ;;
      f) carbon-gym report "$OUT" --section bound ;;        g) carbon-gym report "$OUT" --section diurnal ;;
      h) carbon-gym report "$OUT" --section capacity ;;     i) carbon-gym report "$OUT" --section sessions ;;
      j) carbon-gym report "$OUT" --section generalise ;;    a) carbon-gym report "$OUT" --section headline ;;
      k) carbon-gym report "$OUT" --section learned-capacity ;;
      *) echo "stage $stage: its section is not rewritten on its own: carbon-gym report $OUT --force" >&2 ;;
    esac
  done
fi
