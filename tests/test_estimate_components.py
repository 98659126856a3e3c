"""eval/estimate_components.py: the per-request split of a scheduler's TTFT estimate."""

from __future__ import annotations

import numpy as np

from eval.estimate_components import components, joined, main


def test_split_adds_up_and_the_join_keeps_the_last_estimate():
    rec = {"arrival_s": np.array([1.0, 2.0, 2.0, 0.5]), "origin": np.array([0, 0, 1, 0]), "ttft_s": np.array([1.0, 1.5, 2.0, 9.0]),
           "network_s": np.array([0.2, 0.1, 0.3, 0.1]), "queue_wait_s": np.array([0.3, 0.6, 0.9, 0.1]),
           "prefill_s": np.array([0.4, 0.7, 0.7, 0.1]), "prompt_tokens": np.array([100, 200, 300, 50]),
           "datacenter": np.array([0, 1, 1, 0])}
    est = {"arrival_s": np.array([1.0, 2.0, 2.0, 2.0]), "origin": np.array([0, 0, 1, 0]),
           "ttft_estimate_s": np.array([0.9, 9.9, 1.8, 1.2]), "decided_s": np.array([1.1, 2.1, 2.1, 2.2])}
    j = joined(est, rec, 0.8)  # the request arriving at 0.5 s is before the window; (2.0, 0)'s last estimate is 1.2 s
    assert j["ttft_s"].tolist() == [1.0, 1.5, 2.0] and j["ttft_estimate_s"].tolist() == [0.9, 1.2, 1.8]
    c = components(j)
    np.testing.assert_allclose(c["known_s"] + c["real_engine_s"], j["ttft_s"])
    np.testing.assert_allclose(c["known_s"], [0.1 + 0.2, 0.2 + 0.1, 0.1 + 0.3])
    np.testing.assert_allclose(c["error_s"], [-0.1, -0.3, -0.2])


def test_cli_prints_the_split_for_a_real_episode(capsys):
    assert main(["--scenario", "dev", "--policy", "greedy-cap", "--duration-s", "30", "--warmup-s", "10"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("dev greedy-cap seed 1 (scenario defaults): ") and "requests in the window" in out[0]
    assert out[-1].startswith("engine_part_corr=") and -1.0 <= float(out[-1].split("=")[1]) <= 1.0
    assert any(line.startswith("TTFT error (estimated - realised) p1/p10/p50/p90/p99 ms: ") for line in out)
