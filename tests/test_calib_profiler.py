"""GPU profiling script: CPU dry run of the whole code path; clean skip without CUDA."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from calibration.io import load_attention_anchors, load_operator_profile  # noqa: E402
from calibration.profile_fit import fit_attention, fit_linear  # noqa: E402
from calibration.profiler import SKIP_MESSAGE, profile_main  # noqa: E402
from calibration.shapes import LAYER_OPS  # noqa: E402


@pytest.mark.parametrize("model,tp", [("llama-3.1-8b", 1), ("mixtral-8x7b", 2)])
def test_cpu_tiny_dry_run_writes_readable_profiles(tmp_path, model, tp):
    lines: list[str] = []
    assert profile_main(model, tp, tmp_path, device="cpu", tiny=True, log=lines.append) == 0
    prof = load_operator_profile(tmp_path / "mlp.csv")[tp]
    assert prof.tokens.tolist() == [1.0, 4.0, 16.0, 64.0]
    for op in LAYER_OPS + ("emb",):
        assert np.all(prof.ops_ms[op] > 0)
    assert ("moe_router" in prof.ops_ms) == model.startswith("mixtral")
    assert prof.shape["n_embd"] == 256
    anchors = load_attention_anchors(tmp_path / "attention_anchors.txt")
    assert anchors.tp == tp and anchors.prefill_chunk.size == 3 and anchors.decode_batch.size == 3
    fit_linear(prof, layers=2, knots=(4, 16))  # the fitting code reads what the profiler writes
    fit_attention(anchors)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["tp"] == tp and meta["power"] == "skipped"
    assert any("power: needs a CUDA device" in s for s in lines)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_no_cuda_skips_cleanly(tmp_path):
    lines: list[str] = []
    assert profile_main("llama-3.1-8b", 1, tmp_path / "out", device="cuda", log=lines.append) == 0
    assert lines == [SKIP_MESSAGE] and "no CUDA device; skipped" in SKIP_MESSAGE
    assert not (tmp_path / "out").exists()
