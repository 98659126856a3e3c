"""Running a matrix of runs: in this process, on a local process pool, or on Ray.

:func:`run_matrix` runs every :class:`~eval.runner.RunSpec` with :func:`~eval.runner.run_one`
and returns the results in the order of the specs, whatever the backend: the local (process
pool) and Ray backends run the same function and the driver orders results by spec, so both give
the same tables. Errors in a worker come back as :class:`WorkerError` and are raised in the
driver as :class:`RunFailed`, naming the run.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Sequence

from eval.runner import RunResult, RunSpec, StepProgress, episode_steps, run_one

__all__ = ["run_matrix", "RunFailed", "WorkerError", "default_workers"]


class WorkerError(Exception):
    """A picklable stand-in for an exception raised in a worker process or on a Ray node.

    (Some exception types, e.g. ones with required constructor arguments, cannot be unpickled,
    which would break the process pool.) ``kind`` is ``"config"`` for
    :class:`~carbon_gym.errors.ConfigError`, ``"carbon_gym"`` for other documented carbon_gym
    errors, ``"other"`` otherwise; ``traceback`` is the worker's formatted traceback.
    """

    def __init__(self, kind: str, type_name: str, message: str, traceback: str = ""):
        super().__init__(kind, type_name, message, traceback)
        self.kind = kind
        self.type_name = type_name
        self.message = message
        self.traceback = traceback

    def __str__(self) -> str:
        return self.message if self.kind != "other" else f"{self.type_name}: {self.message}"


def _wrap_exception(exc: BaseException) -> WorkerError:
    import traceback

    from carbon_gym.errors import CarbonGymError, ConfigError

    kind = "config" if isinstance(exc, ConfigError) else "carbon_gym" if isinstance(exc, CarbonGymError) else "other"
    return WorkerError(kind, type(exc).__name__, str(exc), "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def _run_one_worker(spec: RunSpec, keep_requests: bool, queue: Any = None, index: int = -1) -> RunResult:
    """Top-level (picklable) entry point for process-pool and Ray workers; errors come back as
    :class:`WorkerError`. With ``queue`` (anything with ``put``), ``(index, steps done)`` is put
    on it every half second of the episode, for the driver's progress bar."""
    try:
        obs = [StepProgress(lambda n: queue.put((index, n)))] if queue is not None else []
        return run_one(spec, keep_requests=keep_requests, observers=obs)
    except Exception as exc:  # noqa: BLE001 - re-raised in the driver as RunFailed
        raise _wrap_exception(exc) from None


class _Progress:
    """The driver's progress bar, in env steps over the whole matrix (so it moves inside long
    runs), with the runs finished as a postfix; fed from workers through a queue."""

    def __init__(self, specs: Sequence[RunSpec], enabled: bool) -> None:
        self.bar = None
        if not enabled:
            return
        from tqdm import tqdm

        cache: dict[tuple[str, str], int] = {}
        self.totals = []
        for sp in specs:
            k = (sp.scenario, repr(sp.overrides))  # (values may be lists, e.g. a "faults" override)
            if k not in cache:
                cache[k] = episode_steps(sp)
            self.totals.append(cache[k])
        self.done_steps = [0] * len(specs)
        self.runs_done = 0
        self.n_runs = len(specs)
        self.bar = tqdm(total=sum(self.totals), unit="step", desc="eval", file=sys.stderr, dynamic_ncols=True)

    def steps(self, i: int, n: int) -> None:
        if self.bar is None or i < 0:
            return
        n = min(int(n), self.totals[i])
        if n > self.done_steps[i]:
            self.bar.update(n - self.done_steps[i])
            self.done_steps[i] = n

    def finished(self, i: int, run_id: str) -> None:
        if self.bar is None:
            return
        self.runs_done += 1
        self.steps(i, self.totals[i])
        self.bar.set_postfix_str(f"runs {self.runs_done}/{self.n_runs}: {run_id}", refresh=True)

    def drain(self, queue: Any) -> None:
        """Apply every report waiting in ``queue`` (non-blocking)."""
        if queue is None or self.bar is None:
            return
        import queue as _q

        while True:
            try:
                i, n = queue.get_nowait()
            except (_q.Empty, EOFError, OSError):
                return
            except Exception:  # noqa: BLE001 - ray.util.queue.Empty and the like: nothing more to read
                return
            self.steps(i, n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# ----------------------------------------------------------------------------------------------
# the matrix


class RunFailed(RuntimeError):
    """A run of the matrix raised; the message names the run and the original error."""

    def __init__(self, spec: RunSpec, exc: BaseException):
        self.spec = spec
        self.original = exc
        name = exc.type_name if isinstance(exc, WorkerError) else type(exc).__name__
        super().__init__(f"run {spec.run_id} failed: {name}: {exc}")

    @property
    def kind(self) -> str:
        """``"config"``, ``"carbon_gym"`` or ``"other"`` (see :class:`WorkerError`)."""
        exc = self.original
        kind = getattr(exc, "kind", None)
        if isinstance(exc, WorkerError) and kind:
            return kind
        return _wrap_exception(exc).kind


_POLICY_COST = {"milp": 8.0, "ilp-state": 5.0, "ilp": 4.0, "clairvoyant": 1.5}


def _cost_hint(spec: RunSpec) -> float:
    """Rough relative cost used only to start long runs first (better packing of workers)."""
    load = 1.0
    for word, w in (("high", 3.0), ("moderate", 2.0), ("low", 1.0)):
        if word in spec.scenario_name:
            load = w
            break
    model = 2.0 if "mixtral" in spec.scenario_name else 1.0
    return _POLICY_COST.get(spec.policy, 1.0) * load * model


def default_workers() -> int:
    """All local cores (``os.cpu_count()``)."""
    return max(1, os.cpu_count() or 1)


def run_matrix(
    specs: Sequence[RunSpec],
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    keep_requests: bool | Callable[[RunSpec], bool] = True,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every spec and return the results **in the order of** ``specs``.

    Args:
        workers: local processes (default: all cores); 1 runs in this process.
        ray_address: if given, fan out over Ray instead (``"local"`` starts a local instance
            with ``workers`` CPUs and stops it at the end, anything else is passed to
            ``ray.init(address=...)``, e.g. ``"auto"`` or ``"ray://head:10001"``); Ray is the
            optional ``carbon-gym[ray]`` extra (and in the ``test`` extra).
        progress: a tqdm bar over runs on stderr.
        keep_requests: return per-request records (else only metrics and steps); a callable
            decides per spec.
        on_result: called in this process with each result as it arrives (any order), e.g. to
            write its files; it may clear ``result.requests`` to free memory.
    """
    specs = list(specs)
    if not specs:
        return []
    keep = [bool(keep_requests(s)) if callable(keep_requests) else bool(keep_requests) for s in specs]
    order = sorted(range(len(specs)), key=lambda i: (-_cost_hint(specs[i]), i))
    results: list[RunResult | None] = [None] * len(specs)
    bar = _Progress(specs, progress)

    def done(i: int, res: RunResult) -> None:
        if on_result is not None:
            on_result(res)
        results[i] = res
        bar.finished(i, specs[i].run_id)

    class _Direct:  # in this process: the reports go straight to the bar
        def __init__(self, i: int) -> None:
            self.i = i

        def put(self, item: tuple[int, int]) -> None:
            bar.steps(*item)

    try:
        if ray_address:
            _run_ray(specs, order, ray_address, keep, done, workers, bar if progress else None)
        else:
            n = workers if workers is not None else default_workers()
            if n <= 1 or len(specs) == 1:
                for i in order:
                    try:
                        res = _run_one_worker(specs[i], keep[i], _Direct(i) if progress else None, i)
                    except WorkerError as exc:
                        raise RunFailed(specs[i], exc) from None
                    done(i, res)
            else:
                _run_pool(specs, order, min(n, len(specs)), keep, done, bar if progress else None)
    finally:
        bar.close()
    return [r for r in results if r is not None]


def _run_pool(specs: list[RunSpec], order: list[int], n: int, keep: list[bool], done: Callable[[int, RunResult], None],
              bar: _Progress | None = None) -> None:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # spawn: no fork of a parent holding threads (tqdm) or solver state; workers import afresh.
    ctx = multiprocessing.get_context("spawn")
    manager = ctx.Manager() if bar is not None else None
    queue = manager.Queue() if manager is not None else None
    with ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        futures = {pool.submit(_run_one_worker, specs[i], keep[i], queue, i): i for i in order}
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, timeout=0.5 if bar is not None else None, return_when=FIRST_COMPLETED)
                if bar is not None:
                    bar.drain(queue)
                for fut in finished:
                    i = futures[fut]
                    exc = fut.exception()
                    if exc is not None:
                        raise RunFailed(specs[i], exc) from exc
                    done(i, fut.result())
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
        finally:
            if manager is not None:
                manager.shutdown()


def _run_ray(specs: list[RunSpec], order: list[int], address: str, keep: list[bool], done: Callable[[int, RunResult], None],
             workers: int | None = None, bar: _Progress | None = None) -> None:
    """Every spec as one Ray task (one CPU each). ``address="local"`` starts a new local
    instance (``workers`` CPUs, default all) and shuts it down at the end; any other address
    (``"auto"``, ``"ray://head:10001"``, ``"head:6379"``) joins that cluster. A Ray instance
    already initialised in this process is used as it is."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray-address needs Ray: pip install 'carbon-gym[ray]'") from None
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"ignore_reinit_error": True, "log_to_driver": False, "include_dashboard": False}
        if address == "local":
            kwargs["address"] = "local"  # a new local instance, even where RAY_ADDRESS names a cluster
            if workers is not None:
                kwargs["num_cpus"] = int(workers)
        else:
            kwargs["address"] = address
        ray.init(**kwargs)
        started = True
    try:
        queue = None
        if bar is not None:
            from ray.util.queue import Queue

            queue = Queue(actor_options={"num_cpus": 0})
        remote = ray.remote(num_cpus=1)(_run_one_worker)
        refs = {remote.remote(specs[i], keep[i], queue, i): i for i in order}
        pending = list(refs)
        while pending:
            finished, pending = ray.wait(pending, num_returns=1, timeout=0.5 if bar is not None else None)
            if bar is not None:
                bar.drain(queue)
            for ref in finished:
                i = refs[ref]
                try:
                    res = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - RayTaskError wraps the worker's WorkerError
                    for r in pending:
                        ray.cancel(r)
                    cause = getattr(exc, "cause", None)
                    raise RunFailed(specs[i], cause if isinstance(cause, WorkerError) else exc) from None
                done(i, res)
    finally:
        if started:
            ray.shutdown()
