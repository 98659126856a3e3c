"""End-of-episode accounting: every request and every joule is accounted for.

:func:`check_ledger` checks, for one episode (the env calls it on the final step and reports
the result in ``info["episode_metrics"]["ledger"]``):

Requests
    ``arrived = completed + in_flight_at_truncation + unplaced_at_end``, where ``completed``
    includes ``failed_over_completed`` (requests that lost their progress to an outage, were
    placed again and completed: a subset, reported); ``placed = completed + in_flight +
    failed_over`` (every submission either completed, is still in flight, or was aborted by an
    outage and re-queued); ``failed_over_completed <= min(failed_over, completed)``; and the
    simulator's own counts (submitted, completed, aborted, in flight) agree with the env's.

Energy and carbon (per datacenter and in total)
    ``facility = (gpu + host) x PUE`` with ``0 <= idle <= gpu``; the sum of the per-step
    figures the env reported (reset + every step) equals the simulator's totals; and the
    *active* energy (``(gpu - idle) x PUE``, the part batches share) equals the per-request
    shares of completed requests + the shares of failed-over requests (wasted work) + the
    shares of requests still in flight + iterations under way (not yet split) + iterations cut
    short by outages. The same for carbon. Power states (capacity control): the host energy of
    the nodes on, in standby, off and booting (each integrated from its own power) sums to the
    host energy, and no state's energy (:meth:`~carbon_gym.sim.SimTotals.energy_by_state`) is
    negative; the GPU energy of the active state is what the request-share identity checks. What is not attributed to any request
    (``unattributed``) is the idle and host energy plus the last two terms.

Prompt tokens (prefix caching, :mod:`carbon_gym.sim.prefix_cache`)
    per datacenter ``0 <= cached_prompt_tokens <= prompt_tokens`` and ``prefill_saved_tokens >=
    cached_prompt_tokens`` (a request re-admitted after a preemption may hit the cache again).

A failed check raises :class:`~carbon_gym.errors.LedgerError` when ``strict`` (tests), and is
otherwise reported with ``ok = False`` and the reasons in ``problems``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import LedgerError

__all__ = ["check_ledger", "LEDGER_RTOL"]

#: Relative tolerance of the energy / carbon identities (float rounding over long runs).
LEDGER_RTOL = 1e-7


def _close(a: np.ndarray | float, b: np.ndarray | float, rtol: float, scale: np.ndarray | float = 1.0) -> np.ndarray:
    """``|a - b| <= rtol x max(|a|, |b|, scale, 1)``: ``scale`` is the magnitude of the sums ``a``
    was computed from, when ``a`` is a difference of them."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.abs(a - b) <= rtol * np.maximum(np.maximum(np.maximum(np.abs(a), np.abs(b)), np.abs(scale)), 1.0)


def check_ledger(  # noqa: C901
    *,
    arrived: int,
    placed: int,
    completed: int,
    failed_over: int,
    failed_over_completed: int,
    in_flight: int,
    unplaced: int,
    totals: Any,
    attribution: Any,
    completed_energy_j: np.ndarray,
    completed_carbon_g: np.ndarray,
    failed_over_energy_j: np.ndarray,
    failed_over_carbon_g: np.ndarray,
    reported_energy_j: float,
    reported_carbon_g: float,
    pue: np.ndarray,
    strict: bool = True,
    rtol: float = LEDGER_RTOL,
) -> dict[str, Any]:
    """Check one episode's accounting (see the module docstring); return the ledger.

    Args:
        arrived, placed, completed, failed_over, failed_over_completed, in_flight, unplaced:
            the env's request counts (``placed`` counts re-submissions after an outage).
        totals: the simulator's :class:`~carbon_gym.sim.SimTotals` at the end.
        attribution: the simulator's :class:`~carbon_gym.sim.EnergyAttribution` at the end.
        completed_energy_j, completed_carbon_g: (D,) sums of the completed requests' shares
            per datacenter (J facility, g).
        failed_over_energy_j, failed_over_carbon_g: (D,) sums of the aborted requests' shares.
        reported_energy_j, reported_carbon_g: sums of the per-step ``energy_j`` / ``carbon_g``
            the env reported (reset included).
        pue: (D,) PUE per datacenter.
        strict: raise :class:`LedgerError` on any failed check.
        rtol: relative tolerance of the energy / carbon identities.

    Returns:
        dict of numbers (J, g, counts) plus ``ok`` (bool) and ``problems`` ("" when ok).
    """
    problems: list[str] = []
    # ---- requests
    if arrived != completed + in_flight + unplaced:
        problems.append(f"arrived {arrived} != completed {completed} + in flight {in_flight} + unplaced {unplaced}")
    if placed != completed + in_flight + failed_over:
        problems.append(f"placed {placed} != completed {completed} + in flight {in_flight} + failed over {failed_over}")
    if not 0 <= failed_over_completed <= min(failed_over, completed):
        problems.append(f"failed-over-and-completed {failed_over_completed} not in [0, min(failed over {failed_over}, "
                        f"completed {completed})]")
    if min(arrived, placed, completed, failed_over, in_flight, unplaced) < 0:
        problems.append("a request count is negative")
    for name, sim_v, env_v in (("submitted", totals.submitted, placed), ("completed", totals.completed, completed),
                               ("aborted", totals.aborted, failed_over), ("in flight", totals.in_flight, in_flight)):
        if int(sim_v) != int(env_v):
            problems.append(f"simulator {name} {int(sim_v)} != env {int(env_v)}")
    # ---- prompt tokens (prefix caching): cached <= prompt, saved >= cached (re-admissions), none negative
    prompt_t = np.asarray(getattr(totals, "prompt_tokens", ()), dtype=np.int64)
    cached_t = np.asarray(getattr(totals, "cached_prompt_tokens", ()), dtype=np.int64)
    saved_t = np.asarray(getattr(totals, "prefill_saved_tokens", ()), dtype=np.int64)
    if prompt_t.shape == cached_t.shape == saved_t.shape and prompt_t.size:
        if np.any(cached_t < 0) or np.any(cached_t > prompt_t) or np.any(saved_t < cached_t):
            problems.append(f"prefix-cache tokens out of order: need 0 <= cached {cached_t} <= prompt {prompt_t} and "
                            f"saved {saved_t} >= cached")
    # ---- energy
    pue = np.asarray(pue, dtype=np.float64)
    gpu = np.asarray(totals.gpu_energy_j, dtype=np.float64)
    host = np.asarray(totals.host_energy_j, dtype=np.float64)
    idle = np.asarray(totals.idle_energy_j, dtype=np.float64)
    it = np.asarray(totals.it_energy_j, dtype=np.float64)
    fac = np.asarray(totals.facility_energy_j, dtype=np.float64)
    carbon = np.asarray(totals.carbon_g, dtype=np.float64)
    a = attribution
    if not np.all(_close(it, gpu + host, rtol)):
        problems.append(f"IT energy != GPU + host energy per datacenter: {it} vs {gpu + host}")
    if not np.all(_close(fac, it * pue, rtol)):
        problems.append("facility energy != IT energy x PUE")
    tol_idle = rtol * np.maximum(gpu, 1.0)
    if np.any(idle < -tol_idle) or np.any(idle > gpu + tol_idle):
        problems.append(f"idle energy outside [0, GPU energy]: idle {idle}, gpu {gpu}")
    if not _close(reported_energy_j, fac.sum(), rtol):
        problems.append(f"sum of the per-step energy {reported_energy_j!r} J != simulator total {fac.sum()!r} J")
    if not _close(reported_carbon_g, carbon.sum(), rtol):
        problems.append(f"sum of the per-step carbon {reported_carbon_g!r} g != simulator total {carbon.sum()!r} g")
    hs = np.asarray(totals.host_state_energy_j, dtype=np.float64)
    if not np.all(_close(hs.sum(axis=0), host, rtol)):
        problems.append(f"host energy by node state (on, standby, off, booting) {hs.sum(axis=0)} != host energy {host}")
    negative = [k for k, v in totals.energy_by_state().items() if np.any(v < -rtol * np.maximum(it, 1.0))]
    if negative:
        problems.append(f"negative energy in power state(s) {negative}")
    active_e = np.asarray(a.active_energy_j, dtype=np.float64)
    active_c = np.asarray(a.active_carbon_g, dtype=np.float64)
    ce, cc = np.asarray(completed_energy_j, dtype=np.float64), np.asarray(completed_carbon_g, dtype=np.float64)
    fe, fc = np.asarray(failed_over_energy_j, dtype=np.float64), np.asarray(failed_over_carbon_g, dtype=np.float64)
    parts_e = ce + fe + a.in_flight_share_j + a.in_progress_j + a.aborted_partial_j
    parts_c = cc + fc + a.in_flight_share_carbon_g + a.in_progress_carbon_g + a.aborted_partial_carbon_g
    # active = (GPU - idle energy) x PUE is a difference of large sums: its rounding is relative to
    # the GPU energy (and carbon), not to itself (a datacenter with no work gives -1e-7 J, not 0)
    bad = ~_close(active_e, parts_e, rtol, scale=gpu * pue)
    if np.any(bad):
        d = int(np.flatnonzero(bad)[0])
        problems.append(f"datacenter {d}: active energy {active_e[d]!r} J != request shares + in flight + under way "
                        f"+ cut by outages {parts_e[d]!r} J")
    bad = ~_close(active_c, parts_c, rtol, scale=carbon)
    if np.any(bad):
        d = int(np.flatnonzero(bad)[0])
        problems.append(f"datacenter {d}: active carbon {active_c[d]!r} g != sum of its parts {parts_c[d]!r} g")
    tol_c = rtol * np.maximum(carbon, 1.0)
    if np.any(active_c < -tol_c) or np.any(active_c > carbon + tol_c):
        problems.append("active carbon outside [0, total carbon]")

    attributed_e = float(ce.sum() + fe.sum())
    attributed_c = float(cc.sum() + fc.sum())
    ledger: dict[str, Any] = {
        "ok": not problems,
        "problems": "; ".join(problems),
        "arrived": int(arrived),
        "placed": int(placed),
        "completed": int(completed),
        "failed_over": int(failed_over),
        "failed_over_completed": int(failed_over_completed),
        "in_flight_at_truncation": int(in_flight),
        "unplaced_at_end": int(unplaced),
        "energy_j": float(fac.sum()),
        "idle_energy_j": float((idle * pue).sum()),
        "host_energy_j": float((host * pue).sum()),
        "active_energy_j": float(active_e.sum()),
        "attributed_energy_j": attributed_e,
        "unattributed_energy_j": float(fac.sum()) - attributed_e,
        "in_flight_energy_j": float(np.sum(a.in_flight_share_j)),
        "wasted_energy_j": float(fe.sum() + np.sum(a.aborted_partial_j)),
        "carbon_g": float(carbon.sum()),
        "active_carbon_g": float(active_c.sum()),
        "attributed_carbon_g": attributed_c,
        "unattributed_carbon_g": float(carbon.sum()) - attributed_c,
        "wasted_carbon_g": float(fc.sum() + np.sum(a.aborted_partial_carbon_g)),
    }
    if problems and strict:
        raise LedgerError("episode ledger: " + "; ".join(problems))
    return ledger
