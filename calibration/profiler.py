"""GPU profiling script: time a model's real operators on this GPU and sample its power (no vLLM).

What it measures, for one layer of the model's shapes on one GPU of a TP-``tp`` engine (bf16):

* token-level operators over a grid of token counts: embedding, RMSNorm (x2), QKV projection,
  rotary embedding, attention output projection, MLP up (gate+up fused) / SiLU-and-mul / down,
  residual add; for mixture-of-experts models (Mixtral) the MLP operators run the routed experts
  (gate matmul + top-k + token permutation timed as ``moe_router``; each touched expert's
  matmuls on its tokens);
* attention through ``torch.nn.functional.scaled_dot_product_attention``: prefill chunks after
  ``kv`` cached tokens (lower-right causal mask, ``torch.nn.attention.bias.causal_lower_right``;
  KV heads expanded to the query heads beforehand, since that path does not take GQA), and
  decode batches (one query token per sequence; the query heads sharing a KV head are laid out
  along the query-length axis, so each KV head is read once, as a GQA decode kernel does);
  plus the KV-cache write (``index_copy_`` of the new tokens' K and V into a slot array);
* power: while the GPU runs steady idle / decode / prefill / mixed iterations for a few seconds
  each, a thread samples ``power.draw`` through NVML (``pynvml``), else through ``nvidia-smi``,
  else power is skipped with a message.

Outputs (in ``--out``): ``mlp.csv`` and ``attention_anchors.txt`` in the shipped profile's formats
(:mod:`calibration.io`, read by ``calibrate fit``), ``power_log.csv`` + ``power_intervals.csv``
(read by ``calibrate power``) and ``meta.json``. Timings are CUDA-event medians over repeated
calls. Runs in about 1-3 minutes on a data-centre GPU. Without CUDA it exits 0 with a message;
``--device cpu --tiny`` runs the whole code path on tiny shapes in seconds (for tests; the
numbers mean nothing).
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import subprocess
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .io import write_attention_anchors, write_operator_profile, write_power_intervals, write_power_log

TOKENS_GRID = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
               8192, 12288, 16384)
PREFILL_GRID = ((64, 0), (64, 2048), (256, 0), (256, 4096), (512, 0), (512, 512), (512, 8192), (1024, 0),
                (1024, 4096), (2048, 0), (2048, 2048), (2048, 8192), (4096, 0), (4096, 4096), (8192, 0), (8192, 8192))
DECODE_GRID = tuple((b, kv) for kv in (512, 2048, 8192) for b in (1, 4, 16, 64, 128, 256))
POWER_PHASES = (("idle", 0, 0), ("decode", 0, 1), ("decode", 0, 8), ("decode", 0, 32), ("decode", 0, 128),
                ("decode", 0, 256), ("prefill", 128, 0), ("prefill", 512, 0), ("prefill", 2048, 0), ("mixed", 512, 32))
POWER_KV = 1024
TINY = dict(layers=2, hidden=256, query_heads=4, kv_heads=2, head_dim=64, mlp_intermediate=512, vocab=1000)
SKIP_MESSAGE = "no CUDA device; skipped (run on a machine with an NVIDIA GPU, or use --device cpu --tiny for a dry run)"


@dataclass(frozen=True)
class Shapes:
    """Per-model shapes the profiler needs (whole model; TP sharding applied when tensors are built)."""

    name: str
    layers: int
    hidden: int
    query_heads: int
    kv_heads: int
    head_dim: int
    mlp_intermediate: int
    vocab: int
    experts: int = 1
    experts_per_token: int = 1


@dataclass(frozen=True)
class ProfilerConfig:
    """What to run: shapes, TP degree, device, grids, repetitions and power phase length."""

    shapes: Shapes
    tp: int = 1
    device: str = "cuda"
    tokens: tuple[int, ...] = TOKENS_GRID
    prefill: tuple[tuple[int, int], ...] = PREFILL_GRID
    decode: tuple[tuple[int, int], ...] = DECODE_GRID
    trials: int = 5
    target_ms: float = 2.0
    power: bool = True
    power_phase_s: float = 4.0
    power_interval_s: float = 0.05
    max_memory_fraction: float = 0.5


def shapes_for(model: str, tiny: bool = False) -> Shapes:
    """Shapes of a carbon_gym model (``tiny``: a toy model with the same structure)."""
    from carbon_gym.specs import load_model_spec

    spec = load_model_spec(model)
    base = dict(name=spec.name, layers=spec.layers, hidden=spec.hidden, query_heads=spec.query_heads,
                kv_heads=spec.kv_heads, head_dim=spec.head_dim, mlp_intermediate=spec.mlp_intermediate,
                vocab=spec.vocab, experts=spec.experts, experts_per_token=spec.experts_per_token)
    if tiny:
        base.update(TINY, name=f"tiny-{spec.name}", experts=min(spec.experts, 4))
    return Shapes(**base)


# ------------------------------------------------------------------------------------ timing


class _Timer:
    """Median milliseconds per call of a function (CUDA events on GPU, perf_counter on CPU)."""

    def __init__(self, torch: Any, device: str, trials: int, target_ms: float):
        self.torch, self.cuda, self.trials, self.target_ms = torch, device.startswith("cuda"), trials, target_ms

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def _run(self, fn: Callable[[], Any], calls: int) -> float:
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e3 / calls

    def samples_ms(self, fn: Callable[[], Any]) -> list[float]:
        """Per-call times of ``trials`` trials, each averaging enough calls to last ~target_ms."""
        fn()
        fn()
        self._sync()
        first = self._run(fn, 1)
        calls = int(min(50, max(1, math.ceil(self.target_ms / max(first, 1e-3)))))
        return [self._run(fn, calls) for _ in range(self.trials)]


# ----------------------------------------------------------------------------------- operators


class _Layer:
    """One transformer layer's weights on one GPU, and its operators as closures."""

    def __init__(self, torch: Any, cfg: ProfilerConfig, dtype: Any):
        s, tp, dev = cfg.shapes, cfg.tp, cfg.device
        self.torch, self.F, self.s, self.tp, self.dev, self.dtype = torch, torch.nn.functional, s, tp, dev, dtype
        if s.query_heads % tp or s.kv_heads % tp or s.mlp_intermediate % tp:
            raise ValueError(f"tp={tp} must divide heads ({s.query_heads}, {s.kv_heads}) and the MLP width")
        self.qh, self.kvh, self.d = s.query_heads // tp, s.kv_heads // tp, s.head_dim
        self.inter = s.mlp_intermediate // tp
        g = torch.Generator(device="cpu").manual_seed(0)

        def rand(*shape: int) -> Any:
            return (torch.randn(*shape, generator=g) * 0.02).to(device=dev, dtype=dtype)

        h = s.hidden
        self.emb_w = rand(max(s.vocab // tp, 1), h)
        self.norm_w = torch.ones(h, device=dev, dtype=dtype)
        self.w_qkv = rand((self.qh + 2 * self.kvh) * self.d, h)
        self.w_o = rand(h, self.qh * self.d)
        if s.experts > 1:
            self.w_gate = rand(s.experts, h)
            self.w_up = [rand(2 * self.inter, h) for _ in range(s.experts)]
            self.w_down = [rand(h, self.inter) for _ in range(s.experts)]
        else:
            self.w_up = rand(2 * self.inter, h)
            self.w_down = rand(h, self.inter)

    def rms_norm(self, x: Any) -> Any:
        F = self.F
        if hasattr(F, "rms_norm"):
            return F.rms_norm(x, (x.shape[-1],), self.norm_w, 1e-5)
        return x * self.torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * self.norm_w

    def rope(self, x: Any, cos: Any, sin: Any) -> Any:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return self.torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def token_ops(self, n: int) -> dict[str, Callable[[], Any]]:
        """Closures running each token-level operator for ``n`` tokens."""
        torch, F, s = self.torch, self.F, self.s
        dev, dt = self.dev, self.dtype
        x = torch.randn(n, s.hidden, device=dev, dtype=dt)
        y = torch.randn(n, s.hidden, device=dev, dtype=dt)
        ids = torch.randint(0, self.emb_w.shape[0], (n,), device=dev)
        q = torch.randn(n, self.qh, self.d, device=dev, dtype=dt)
        k = torch.randn(n, self.kvh, self.d, device=dev, dtype=dt)
        cos = torch.randn(n, 1, self.d // 2, device=dev, dtype=dt)
        sin = torch.randn(n, 1, self.d // 2, device=dev, dtype=dt)
        attn_out = torch.randn(n, self.qh * self.d, device=dev, dtype=dt)
        ops: dict[str, Callable[[], Any]] = {
            "emb": lambda: F.embedding(ids, self.emb_w),
            "input_layernorm": lambda: self.rms_norm(x),
            "attn_pre_proj": lambda: F.linear(x, self.w_qkv),
            "attn_rope": lambda: (self.rope(q, cos, sin), self.rope(k, cos, sin)),
            "attn_post_proj": lambda: F.linear(attn_out, self.w_o),
            "post_attention_layernorm": lambda: self.rms_norm(y),
        }
        if s.experts > 1:
            ops.update(self._moe_ops(x))
        else:
            gu = torch.randn(n, 2 * self.inter, device=dev, dtype=dt)
            a = torch.randn(n, self.inter, device=dev, dtype=dt)
            ops["mlp_up_proj"] = lambda: F.linear(x, self.w_up)
            ops["mlp_act"] = lambda: F.silu(gu[:, : self.inter]) * gu[:, self.inter:]
            ops["mlp_down_proj"] = lambda: F.linear(a, self.w_down)
        ops["add"] = lambda: x + y
        return ops

    def _route(self, x: Any) -> tuple[Any, Any, Any, list[int]]:
        torch, F, s = self.torch, self.F, self.s
        logits = F.linear(x, self.w_gate)
        weights, experts = torch.topk(torch.softmax(logits.float(), dim=-1), s.experts_per_token, dim=-1)
        flat = experts.reshape(-1)
        order = torch.argsort(flat)
        counts = torch.bincount(flat, minlength=s.experts).tolist()
        token_of = order // s.experts_per_token
        xs = x.index_select(0, token_of)
        return xs, token_of, weights.reshape(-1)[order].to(x.dtype), counts

    def _moe_ops(self, x: Any) -> dict[str, Callable[[], Any]]:
        torch, F = self.torch, self.F
        xs, token_of, w, counts = self._route(x)
        bounds = [0]
        for c in counts:
            bounds.append(bounds[-1] + c)
        spans = [(e, bounds[e], bounds[e + 1]) for e in range(len(counts)) if counts[e] > 0]
        gu = torch.randn(xs.shape[0], 2 * self.inter, device=self.dev, dtype=self.dtype)
        a = torch.randn(xs.shape[0], self.inter, device=self.dev, dtype=self.dtype)
        out = torch.zeros_like(x)

        def up() -> None:
            for e, lo, hi in spans:
                F.linear(xs[lo:hi], self.w_up[e])

        def act() -> None:
            for _, lo, hi in spans:
                F.silu(gu[lo:hi, : self.inter]) * gu[lo:hi, self.inter:]

        def down() -> None:
            for e, lo, hi in spans:
                out.index_add_(0, token_of[lo:hi], F.linear(a[lo:hi], self.w_down[e]) * w[lo:hi, None])

        return {"moe_router": lambda: self._route(x), "mlp_up_proj": up, "mlp_act": act, "mlp_down_proj": down}

    def prefill_attention(self, chunk: int, kv: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """(attention, KV-cache save) closures for a prefill chunk after ``kv`` cached tokens."""
        torch, F = self.torch, self.F
        from torch.nn.attention.bias import causal_lower_right

        dev, dt = self.dev, self.dtype
        q = torch.randn(1, self.qh, chunk, self.d, device=dev, dtype=dt)
        group = self.qh // self.kvh
        k = torch.randn(1, self.kvh, kv + chunk, self.d, device=dev, dtype=dt).repeat_interleave(group, dim=1)
        v = torch.randn(1, self.kvh, kv + chunk, self.d, device=dev, dtype=dt).repeat_interleave(group, dim=1)
        if kv == 0:
            attn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
        else:
            mask = causal_lower_right(chunk, kv + chunk)
            attn = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
        return attn, self._save(chunk, kv + chunk)

    def decode_attention(self, batch: int, kv: int) -> tuple[Callable[[], Any], Callable[[], Any]]:
        """(attention, KV-cache save) closures for ``batch`` sequences of ``kv`` cached tokens."""
        torch, F = self.torch, self.F
        dev, dt = self.dev, self.dtype
        group = self.qh // self.kvh
        q = torch.randn(batch, self.kvh, group, self.d, device=dev, dtype=dt)
        k = torch.randn(batch, self.kvh, kv, self.d, device=dev, dtype=dt)
        v = torch.randn(batch, self.kvh, kv, self.d, device=dev, dtype=dt)
        return (lambda: F.scaled_dot_product_attention(q, k, v)), self._save(batch, batch * kv)

    def _save(self, new_tokens: int, cache_tokens: int) -> Callable[[], Any]:
        torch = self.torch
        slots = max(cache_tokens, new_tokens)
        cache = torch.zeros(slots, 2, self.kvh, self.d, device=self.dev, dtype=self.dtype)
        idx = torch.randperm(slots, device="cpu")[:new_tokens].to(self.dev)
        new = torch.randn(new_tokens, 2, self.kvh, self.d, device=self.dev, dtype=self.dtype)
        return lambda: cache.index_copy_(0, idx, new)


# ------------------------------------------------------------------------------------- power


class _PowerSampler:
    """Background sampling of GPU power: NVML if importable, else nvidia-smi, else nothing."""

    def __init__(self, gpu_index: int, interval_s: float):
        self.gpu, self.interval_s = gpu_index, interval_s
        self.times: list[float] = []
        self.watts: list[float] = []
        self.method = "none"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(gpu_index)
            self.method = "nvml"
        except Exception:  # noqa: BLE001 - any NVML failure means: try the next method
            self._nvml = None
            if shutil.which("nvidia-smi"):
                self.method = "nvidia-smi"

    def start(self) -> None:
        if self.method == "nvml":
            self._thread = threading.Thread(target=self._nvml_loop, daemon=True)
        elif self.method == "nvidia-smi":
            ms = max(int(self.interval_s * 1e3), 20)
            self._proc = subprocess.Popen(
                ["nvidia-smi", "-i", str(self.gpu), "--query-gpu=power.draw", "--format=csv,noheader,nounits",
                 f"--loop-ms={ms}"], stdout=subprocess.PIPE, text=True)
            self._thread = threading.Thread(target=self._smi_loop, daemon=True)
        if self._thread:
            self._thread.start()

    def _nvml_loop(self) -> None:
        while not self._stop.is_set():
            try:
                mw = self._nvml.nvmlDeviceGetPowerUsage(self._handle)
                self.times.append(time.time())
                self.watts.append(mw / 1e3)
            except Exception:  # noqa: BLE001
                pass
            self._stop.wait(self.interval_s)

    def _smi_loop(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if self._stop.is_set():
                break
            try:
                w = float(line.strip().split()[0])
            except (ValueError, IndexError):
                continue
            self.times.append(time.time())
            self.watts.append(w)

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)


# --------------------------------------------------------------------------------------- run


def _fits(torch: Any, cfg: ProfilerConfig, layer: _Layer, tokens: int, kv_tokens: int, expand: int = 1) -> bool:
    """Whether tensors of ``tokens`` tokens and ``kv_tokens`` KV tokens fit the memory budget."""
    if not cfg.device.startswith("cuda"):
        return True
    free, _ = torch.cuda.mem_get_info(torch.device(cfg.device))
    need = 2 * (tokens * (2 * layer.inter + 4 * cfg.shapes.hidden) + 3 * kv_tokens * layer.kvh * layer.d * expand)
    return need < cfg.max_memory_fraction * free


def run_profile(cfg: ProfilerConfig, out_dir: str | Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Profile operators (and power on CUDA), write the output files; returns the meta data."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cuda = cfg.device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    t_start = time.time()
    torch.manual_seed(0)
    layer = _Layer(torch, cfg, dtype)
    timer = _Timer(torch, cfg.device, cfg.trials, cfg.target_ms)
    s = cfg.shapes
    shape_cols = dict(n_head=s.query_heads, n_kv_head=s.kv_heads, n_embd=s.hidden, n_expanded_embd=s.mlp_intermediate,
                      vocab_size=s.vocab, use_gated_mlp=True)
    rows = []
    with torch.inference_mode():
        for n in cfg.tokens:
            if not _fits(torch, cfg, layer, n, 0):
                log(f"  tokens={n}: skipped (memory)")
                continue
            ops = layer.token_ops(n)
            rows.append({"num_tokens": n, "num_tensor_parallel_workers": cfg.tp, **shape_cols,
                         "ops": {name: timer.samples_ms(fn) for name, fn in ops.items()}})
            del ops
        log(f"  operators: {len(rows)} token counts in {time.time() - t_start:.1f} s")
        write_operator_profile(out / "mlp.csv", rows)
        prefill, decode = [], []
        group = s.query_heads // s.kv_heads
        for c, kv in cfg.prefill:
            if not _fits(torch, cfg, layer, c, kv + c, expand=group):
                continue
            attn, save = layer.prefill_attention(c, kv)
            prefill.append((c, kv, _median(timer.samples_ms(attn)), _median(timer.samples_ms(save))))
        for b, kv in cfg.decode:
            if not _fits(torch, cfg, layer, b, b * kv):
                continue
            attn, save = layer.decode_attention(b, kv)
            decode.append((b, kv, _median(timer.samples_ms(attn)), _median(timer.samples_ms(save))))
        write_attention_anchors(out / "attention_anchors.txt", prefill, decode, tp=cfg.tp,
                                comment=f"measured by calibration/profiler.py, {s.name}, tp {cfg.tp}, {cfg.device}")
        log(f"  attention: {len(prefill)} prefill and {len(decode)} decode points")
        power_method = "skipped"
        if cfg.power and cuda:
            power_method = _power_phases(torch, cfg, layer, out, log)
        elif cfg.power:
            log("  power: needs a CUDA device and NVML or nvidia-smi; skipped")
    meta = {
        "device": torch.cuda.get_device_name(torch.device(cfg.device)) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None), "dtype": str(dtype),
        "shapes": asdict(s), "tp": cfg.tp, "power": power_method, "seconds": round(time.time() - t_start, 1),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return meta


def _median(v: list[float]) -> float:
    v = sorted(v)
    m = len(v) // 2
    return v[m] if len(v) % 2 else 0.5 * (v[m - 1] + v[m])


def _power_phases(torch: Any, cfg: ProfilerConfig, layer: _Layer, out: Path, log: Callable[[str], None]) -> str:
    """Run steady phases while sampling power; write the power log and the intervals."""
    index = torch.device(cfg.device).index or 0
    sampler = _PowerSampler(index, cfg.power_interval_s)
    if sampler.method == "none":
        log("  power: neither pynvml nor nvidia-smi available; skipped")
        return "none"
    intervals = []
    sampler.start()
    try:
        time.sleep(1.0)
        for phase, n_prefill, n_decode in POWER_PHASES:
            step = _iteration(layer, cfg, n_prefill, n_decode) if phase != "idle" else None
            if step is not None:
                step()  # warm up allocations before the interval starts
            torch.cuda.synchronize()
            t0 = time.time()
            while time.time() - t0 < cfg.power_phase_s:
                if step is None:
                    time.sleep(0.05)
                else:
                    step()
                    torch.cuda.synchronize()
            intervals.append((t0, time.time(), phase, n_prefill, n_decode))
        time.sleep(0.5)
    finally:
        sampler.stop()
    write_power_log(out / "power_log.csv", sampler.times, [index] * len(sampler.times), sampler.watts)
    write_power_intervals(out / "power_intervals.csv", intervals)
    log(f"  power: {len(sampler.watts)} samples via {sampler.method}, {len(intervals)} phases")
    return sampler.method


def _iteration(layer: _Layer, cfg: ProfilerConfig, n_prefill: int, n_decode: int) -> Callable[[], None]:
    """One simulated engine iteration (all layers, weights reused) with this batch."""
    ops = list(layer.token_ops(n_prefill + n_decode).values())
    parts = [] if n_decode == 0 else [layer.decode_attention(n_decode, POWER_KV)[0]]
    if n_prefill:
        parts.append(layer.prefill_attention(n_prefill, 0)[0])

    def step() -> None:
        for _ in range(cfg.shapes.layers):
            for fn in ops:
                fn()
            for fn in parts:
                fn()

    return step


def profile_main(model: str, tp: int, out_dir: str | Path | None, device: str = "cuda", tiny: bool = False,
                 power: bool = True, quick: bool = False, log: Callable[[str], None] = print) -> int:
    """Entry point of ``calibrate profile``; returns the exit status (0 when skipped for lack of CUDA)."""
    try:
        import torch
    except ImportError:
        log("torch is not installed; skipped (pip install torch)")
        return 0
    if device.startswith("cuda") and not torch.cuda.is_available():
        log(SKIP_MESSAGE)
        return 0
    shapes = shapes_for(model, tiny)
    if tiny:
        cfg = ProfilerConfig(shapes, tp, device, tokens=(1, 4, 16, 64), prefill=((16, 0), (16, 32), (64, 0)),
                             decode=((1, 32), (4, 32), (4, 128)), trials=2, target_ms=0.2, power=power,
                             power_phase_s=0.5)
    elif quick:
        cfg = ProfilerConfig(shapes, tp, device, tokens=TOKENS_GRID[::2], prefill=PREFILL_GRID[::2],
                             decode=DECODE_GRID[::2], trials=3, power=power, power_phase_s=2.0)
    else:
        cfg = ProfilerConfig(shapes, tp, device, power=power)
    if out_dir is None:
        name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
        slug = "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")
        out_dir = Path(__file__).resolve().parent / "measurements" / slug / f"{shapes.name}__tp{tp}"
    log(f"profiling {shapes.name} tp={tp} on {device} -> {out_dir}")
    meta = run_profile(cfg, out_dir, log)
    log(f"done in {meta['seconds']} s on {meta['device']}; next: python -m calibration fit --profile "
        f"{Path(out_dir) / 'mlp.csv'} --attention {Path(out_dir) / 'attention_anchors.txt'}")
    return 0
