"""``carbon-gym calibrate`` / ``python -m calibration`` commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from carbon_gym._toml import load_toml
from carbon_gym.physics.latency import latency_params_path
from calibration.cli import main

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]


def test_fit_default_prints_mape_and_writes_nothing(capsys, tmp_path):
    before = latency_params_path("a100-80gb", "llama-3.1-8b", 1).read_text()
    assert main(["fit"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("iteration_mape_pct=")
    assert float(out[-1].split("=")[1]) < 3.0
    assert any(line.strip().startswith("mlp_up_proj") for line in out)  # per-operator error
    assert any("decode batches 1-128" in line for line in out)
    assert any(line.startswith("power fit a100-40gb") for line in out)  # the fit to the serving points
    assert any("overhead_s = max(0, mean residual)" in line for line in out)
    assert latency_params_path("a100-80gb", "llama-3.1-8b", 1).read_text() == before
    assert main(["fit", "--write", "--out", str(tmp_path / "p.toml")]) == 0
    written = load_toml(tmp_path / "p.toml")
    assert written["latency"] == load_toml(latency_params_path("a100-80gb", "llama-3.1-8b", 1))["latency"]


def test_fit_tp2_has_no_whole_iteration_check(capsys):
    assert main(["fit", "--tp", "2"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == "iteration_mape_pct=nan"


def test_power_and_errors(capsys):
    assert main(["power", "--log", str(DATA / "nvidia_smi_power_log.csv"),
                 "--intervals", str(DATA / "power_intervals.csv")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("energy_error_pct=")
    assert main(["power"]) == 2
    assert main(["fit", "--model", "qwen2.5-7b"]) == 2  # the profile is Llama's: a clear error, no traceback
    assert "does not match" in capsys.readouterr().err


def test_serving_command(capsys):
    assert main(["serving", str(DATA / "vllm_bench_llama8b_rate4.json"), "--metric", "tpot"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("overhead_s=") and any("after" in line for line in out)


def test_python_dash_m_calibration():
    r = subprocess.run([sys.executable, "-m", "calibration", "derive"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "a100-80gb__mixtral-8x7b__tp4" in r.stdout and "nothing written" in r.stdout
    r = subprocess.run([sys.executable, "-m", "calibration", "profile"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0
    pytest.importorskip("torch")
    import torch

    if not torch.cuda.is_available():
        assert "no CUDA device; skipped" in r.stdout


def test_validate_prints_table_and_max_error(capsys):
    assert main(["validate"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("max_abs_error_pct=")
    rows = [line.split() for line in out if line.startswith("  power ") and "mlenergy" in line]
    assert len(rows) == 17 and all(abs(float(r[-1])) < 10.0 for r in rows)  # every published power point within 10%
    summary = {line.split()[0]: line for line in out if "points  MAPE" in line}
    assert set(summary) == {"iteration", "token-level", "power", "serving"}
    it = float(summary["iteration"].split("MAPE")[1].split("%")[0])
    assert it <= 3.0  # whole-iteration MAPE over every measured anchor
    assert float(out[-1].split("=")[1]) == pytest.approx(max(abs(float(line.split()[-1])) for line in out
                                                              if line.startswith("  ") and "points  MAPE" not in line
                                                              and line.split()[0] in summary), abs=0.01)
