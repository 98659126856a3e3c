"""Capacity control of one datacenter: engines that sleep and wake, nodes that stand by, power
off and boot (:class:`CapacityControl`).

Engine capacity states (``Engine.cap_state``)::

    AWAKE     weights loaded, serving (its rest power is the idle power)
    DRAINING  awake, told to sleep: takes no new requests, finishes its running and queued ones
    FALLING   falling asleep: weights offloaded, KV cache (and prefix cache) freed (fall_asleep_s at fall_asleep_w)
    ASLEEP    sleeping (sleep_w per GPU); its KV cache is empty when it wakes
    WAKING    waking (wake_s at wake_w), then AWAKE
    OFF       its node is off (0 W)
    BOOTING   its node boots (boot_s; boot_gpu_w per GPU), then AWAKE

Node (server) states: ON, STANDBY (every engine ASLEEP: host power ``host_standby_w``), OFF
(``host_off_w``, GPUs 0 W), BOOTING (``boot_host_w``). Every state's power is integrated by the
datacenter's ledger into its own energy account (:class:`~carbon_gym.sim.results.SimTotals`).

**Targets.** :meth:`CapacityControl.set_targets` sets the engines to keep awake and the nodes to
keep powered; :meth:`reconcile` moves towards them now and again whenever a transition ends:

* too many engines awake (AWAKE + WAKING + BOOTING + FALLING to wake again): the engines to
  sleep are chosen among those, on the highest-index nodes first (so that whole nodes empty and
  can stand by or power off), idle ones first; an idle awake engine falls asleep at once, a busy
  one drains first (its queued requests move to the engines still accepting, if any), one still
  waking or booting is told once it is up, a falling one that no request waits for stays asleep;
* too few: draining engines are kept awake (no cost), falling ones wake as soon as they are
  asleep, sleeping engines on powered nodes wake (lowest node first), then nodes that are off boot;
* nodes: powered nodes (ON, STANDBY, BOOTING) beyond the target that are in standby power off,
  highest index first; too few powered nodes boot (their engines come up awake and the reconcile
  at the end of the boot puts any beyond the awake target to sleep). The node target is at least
  the nodes the awake target needs.

**Arrivals.** A request reaching a datacenter where no engine accepts work waits for one:
:meth:`engine_for_arrival` picks, in order, a waking or booting engine up within ``wake_s``
(the least loaded), a draining one (kept awake), a sleeping one on a powered node (woken), a
falling one (woken once asleep), a booting one (the first up), or boots the first node that is
off. The request's queueing wait includes the wake.
What wakes on demand raises the targets to match (it stays awake until the next decision), so
a controller that set 0 engines sees the scale-from-zero it caused and decides again.

Nothing here is ever called by a datacenter that receives no targets, so ``always_on`` runs are
unchanged bit for bit. Not compiled (``setup.py`` compiles the hot path only); it drives the
compiled engines and datacenter through their attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from .datacenter import Datacenter
    from .engine import Engine

__all__ = ["CapacityControl", "AWAKE", "DRAINING", "FALLING", "ASLEEP", "WAKING", "OFF", "BOOTING",
           "NODE_ON", "NODE_STANDBY", "NODE_OFF", "NODE_BOOTING", "CAP_STATE_NAMES"]

AWAKE, DRAINING, FALLING, ASLEEP, WAKING, OFF, BOOTING = range(7)
CAP_STATE_NAMES = ("awake", "draining", "falling_asleep", "asleep", "waking", "off", "booting")
NODE_ON, NODE_STANDBY, NODE_OFF, NODE_BOOTING = range(4)
#: Ledger classes of an engine's power (Datacenter.engine_state_changed): 0 active, 1 idle, then
#: the dormant states, indexed like Datacenter.state_gpu_w.
CLS_ACTIVE, CLS_IDLE = 0, 1
_DORMANT_CLS = {FALLING: 2, ASLEEP: 3, WAKING: 4, BOOTING: 5, OFF: 6}
#: Heap priority of capacity transition events (arrivals 0, engine events 1).
TRANSITION_PRIORITY = 2


class _Transition:
    """Heap entry object of an engine's capacity transition (ends at its event time)."""

    __slots__ = ("engine", "control")

    def __init__(self, engine: Engine, control: CapacityControl) -> None:
        self.engine = engine
        self.control = control

    @property
    def version(self) -> int:
        return int(self.engine.cap_version)

    def on_event(self, t: float) -> None:
        self.control.transition_done(self.engine, t)


class CapacityControl:
    """The capacity states of one datacenter's engines and nodes (see the module docstring).

    Args:
        dc: the datacenter; its ``models.states`` (:class:`~carbon_gym.physics.power.PowerStates`)
            give the powers.
        engines_per_node: engines on one node (GPUs per node / TP).
        fall_asleep_s, wake_s, boot_s: durations of the transitions for this model and TP, s.
    """

    def __init__(self, dc: Datacenter, engines_per_node: int, fall_asleep_s: float, wake_s: float,
                 boot_s: float) -> None:
        st = dc.models.states
        if st is None:
            raise ConfigError("capacity", f"datacenter {dc.name!r}: the power model has no [states] table "
                              "(sleep / wake / boot parameters); capacity control needs one")
        self.dc = dc
        self.states = st
        self.fall_asleep_s = float(fall_asleep_s)
        self.wake_s = float(wake_s)
        self.boot_s = float(boot_s)
        self.epn = int(engines_per_node)
        self.n_nodes = dc.n_engines // self.epn
        dc.state_host_w[NODE_ON] = dc.host_w  # the host power so far was all the nodes' on
        dc.state_host_j[NODE_ON] = dc.host_j
        self.node_state = [NODE_ON] * self.n_nodes
        self.node_asleep = [0] * self.n_nodes  # engines ASLEEP per node
        self.node_booting = [0] * self.n_nodes  # engines BOOTING per node
        self.awake_target = dc.n_engines
        self.nodes_target = self.n_nodes
        tp = dc.models.tp
        self.engine_w = {FALLING: tp * st.transition_w, ASLEEP: tp * st.sleep_w, WAKING: tp * st.transition_w,
                         BOOTING: tp * st.boot_gpu_w, OFF: 0.0}
        self.wakes = 0  # engines woken (from ASLEEP), counted
        self.boots = 0  # nodes booted, counted
        self.sleeps = 0  # engines put to sleep (fell asleep), counted
        self.waits = 0  # requests that reached the datacenter with no engine accepting (they waited for one)

    # ------------------------------------------------------------------ queries
    def node(self, e: Engine) -> int:
        """Node index of engine ``e``."""
        return e.index // self.epn

    def awakeish(self) -> int:
        """Engines awake or on their way up (AWAKE, WAKING, BOOTING, FALLING to wake again)."""
        n = self.dc.cap_counts
        back = sum(1 for e in self.dc.engines if e.wake_after) if n[FALLING] else 0
        return n[AWAKE] + n[WAKING] + n[BOOTING] + back

    def powered_nodes(self) -> int:
        """Nodes not off (ON, STANDBY, BOOTING)."""
        return sum(1 for s in self.node_state if s != NODE_OFF)

    def ready_delay_s(self, e: Engine, t: float) -> float:
        """Seconds until engine ``e`` could start a new request's prefill, counting its capacity
        transitions only (0 for an awake engine)."""
        s = e.cap_state
        if s in (AWAKE, DRAINING):
            return 0.0
        if s in (WAKING, BOOTING):
            return max(e.cap_end_s - t, 0.0)
        if s == FALLING:
            return max(e.cap_end_s - t, 0.0) + self.wake_s
        if s == ASLEEP:
            return self.wake_s
        return self.boot_s  # OFF

    # ------------------------------------------------------------------ transitions
    def _set_state(self, e: Engine, t: float, new: int, duration_s: float = 0.0) -> None:
        """Move engine ``e`` to capacity state ``new`` at ``t`` (its power and the ledger follow);
        a transition state ends ``duration_s`` later (an event)."""
        dc = self.dc
        old = e.cap_state
        if old == new:
            return
        old_cls = _DORMANT_CLS.get(old, CLS_IDLE if e.is_idle else CLS_ACTIVE)
        if new in _DORMANT_CLS:
            new_w = self.engine_w[new]
            new_cls = _DORMANT_CLS[new]
        else:  # AWAKE or DRAINING
            new_w = e.power_w if old in (AWAKE, DRAINING) else e.rest_w
            new_cls = old_cls if old in (AWAKE, DRAINING) else CLS_IDLE
        dc.engine_state_changed(t, e.power_w, new_w, old_cls, new_cls)
        e.power_w = new_w
        if new_cls == CLS_IDLE:
            e.is_idle = True
        elif new_cls != CLS_ACTIVE:
            e.is_idle = False
        node = self.node(e)
        if old == ASLEEP:
            self.node_asleep[node] -= 1
        if new == ASLEEP:
            self.node_asleep[node] += 1
        counts = dc.cap_counts
        counts[old] -= 1
        counts[new] += 1
        e.cap_state = new
        e.cap_version += 1
        if new in (FALLING, OFF) and e.cache is not None:
            e.cache.clear()  # weights offloaded, KV cache freed: the prefix cache is lost
        if new in (FALLING, WAKING, BOOTING):
            e.cap_end_s = t + duration_s
            e.heap.push(e.cap_end_s, TRANSITION_PRIORITY, _Transition(e, self), e.cap_version)
        self._update_node(node, t)
        dc.refresh_scores()

    def _update_node(self, node: int, t: float) -> None:
        """Standby when every engine of an ON node sleeps; ON again when one leaves sleep."""
        s = self.node_state[node]
        if s == NODE_ON and self.node_asleep[node] == self.epn:
            self._set_node(node, t, NODE_STANDBY)
        elif s == NODE_STANDBY and self.node_asleep[node] < self.epn:
            self._set_node(node, t, NODE_ON)

    def _set_node(self, node: int, t: float, new: int) -> None:
        dc = self.dc
        st = self.states
        per_node = dc.host_on_w / self.n_nodes
        watts = {NODE_ON: per_node, NODE_STANDBY: st.host_standby_w, NODE_OFF: st.host_off_w,
                 NODE_BOOTING: st.boot_host_w}
        old = self.node_state[node]
        dc.node_state_changed(t, watts[old], watts[new], old, new)
        self.node_state[node] = new

    def _sleep(self, sleepers: list[Engine], t: float) -> None:
        """Tell the awake engines ``sleepers`` to sleep: now if they have no work, else once
        drained; the queues of those that drain move to the engines still accepting work (all of
        them told first, so that no queue moves to an engine about to drain)."""
        draining = []
        for e in sleepers:
            if e.state == 0 and not e.waiting and not e.running:  # IDLE, empty
                self._set_state(e, t, FALLING, self.fall_asleep_s)
            else:
                self._set_state(e, t, DRAINING)
                draining.append(e)
        if not draining or not self.dc.accepting_now():
            return
        moved = [r for e in draining for r in e.take_waiting()]
        for r in sorted(moved, key=lambda r: r.rid):
            self.dc.pick().enqueue(r, t)

    def _wake(self, e: Engine, t: float) -> None:
        """Engine ``e`` (ASLEEP) starts waking."""
        self.wakes += 1
        self._set_state(e, t, WAKING, self.wake_s)

    def _boot(self, node: int, t: float) -> None:
        """Node ``node`` (OFF) starts booting; its engines come up awake after ``boot_s``."""
        self.boots += 1
        self._set_node(node, t, NODE_BOOTING)
        for e in self.dc.engines[node * self.epn:(node + 1) * self.epn]:
            self.node_booting[node] += 1
            self._set_state(e, t, BOOTING, self.boot_s)

    def engine_drained(self, e: Engine, t: float) -> None:
        """A DRAINING engine ran out of work at ``t``: it falls asleep."""
        self._set_state(e, t, FALLING, self.fall_asleep_s)

    def transition_done(self, e: Engine, t: float) -> None:
        """The transition of engine ``e`` ends at ``t``."""
        s = e.cap_state
        if s == FALLING:
            self.sleeps += 1
            self._set_state(e, t, ASLEEP)
            if e.wake_after:
                e.wake_after = False
                self._wake(e, t)
        elif s in (WAKING, BOOTING):
            node = self.node(e)
            self._set_state(e, t, AWAKE)
            if s == BOOTING:
                self.node_booting[node] -= 1
                if self.node_booting[node] == 0:
                    self._set_node(node, t, NODE_ON)
            if e.waiting:
                e.state = 1  # WAKE: it plans now (the requests that waited for it)
                e.version += 1
                e._plan(t)
        self.reconcile(t)

    # ------------------------------------------------------------------ decisions
    def set_targets(self, t: float, awake_engines: int, nodes_on: int) -> None:
        """Keep ``awake_engines`` engines awake and ``nodes_on`` nodes powered (at least the nodes
        the awake engines need), from ``t`` on."""
        dc = self.dc
        self.awake_target = max(0, min(int(awake_engines), dc.n_engines))
        need = -(-self.awake_target // self.epn)
        self.nodes_target = max(need, min(int(nodes_on), self.n_nodes))
        self.reconcile(t)

    def reconcile(self, t: float) -> None:  # noqa: C901
        """Move the engines and nodes towards the targets (see the module docstring)."""
        dc = self.dc
        if not dc.up:
            return
        engines = dc.engines
        have = self.awakeish()
        target = self.awake_target
        if have > target:
            # choose among every engine counted in ``have`` (a node still booting is the first to
            # go back to sleep, not the awake engines of the nodes below it); an awake one sleeps
            # now, one on its way up once it is up (the reconcile then), a falling one with no
            # request waiting for it stays asleep
            cands = [e for e in engines if e.cap_state in (AWAKE, WAKING, BOOTING)
                     or (e.cap_state == FALLING and e.wake_after)]
            cands.sort(key=lambda e: (-self.node(e), bool(e.waiting or e.running), -e.index))
            chosen = cands[:have - target]
            for e in chosen:
                if e.cap_state == FALLING and not e.waiting:
                    e.wake_after = False
            self._sleep([e for e in chosen if e.cap_state == AWAKE], t)
        elif have < target:
            need = target - have
            for e in engines:
                if need and e.cap_state == DRAINING:
                    self._set_state(e, t, AWAKE)
                    need -= 1
            for e in engines:
                if need and e.cap_state == FALLING and not e.wake_after:
                    e.wake_after = True
                    need -= 1
            for e in engines:
                if need and e.cap_state == ASLEEP and self.node_state[self.node(e)] != NODE_OFF:
                    self._wake(e, t)
                    need -= 1
            for node in range(self.n_nodes):
                if need > 0 and self.node_state[node] == NODE_OFF:
                    self._boot(node, t)
                    need -= self.epn
        powered = self.powered_nodes()
        if powered > self.nodes_target:
            for node in range(self.n_nodes - 1, -1, -1):
                if powered > self.nodes_target and self.node_state[node] == NODE_STANDBY:
                    self._power_off(node, t)
                    powered -= 1
        elif powered < self.nodes_target:
            for node in range(self.n_nodes):
                if powered < self.nodes_target and self.node_state[node] == NODE_OFF:
                    self._boot(node, t)
                    powered += 1

    def _power_off(self, node: int, t: float) -> None:
        """Power node ``node`` (in standby) off."""
        for e in self.dc.engines[node * self.epn:(node + 1) * self.epn]:
            self._set_state(e, t, OFF)
        self._set_node(node, t, NODE_OFF)

    def engine_for_arrival(self, t: float, commit: bool = True) -> Engine:
        """The engine a request reaching the datacenter at ``t`` goes to when no engine accepts
        work (see the module docstring); with ``commit`` False nothing is changed (estimates)."""
        e = self._engine_for_arrival(t, commit)
        if commit:  # what woke on demand stays awake until the next decision (scale from zero)
            self.waits += 1
            self.awake_target = max(self.awake_target, self.awakeish())
            self.nodes_target = max(self.nodes_target, self.powered_nodes())
        return e

    def _engine_for_arrival(self, t: float, commit: bool) -> Engine:
        engines = self.dc.engines
        up = [e for e in engines if e.cap_state in (WAKING, BOOTING)]
        soon = [e for e in up if e.cap_end_s - t <= self.wake_s]  # (not a node with minutes of boot left)
        if soon:
            return min(soon, key=lambda e: (e.pending_tokens, e.cap_end_s, e.index))
        draining = [e for e in engines if e.cap_state == DRAINING]
        if draining:
            e = min(draining, key=lambda e: (e.pending_tokens, e.index))
            if commit:
                self._set_state(e, t, AWAKE)
            return e
        for e in engines:
            if e.cap_state == ASLEEP and self.node_state[self.node(e)] != NODE_OFF:
                if commit:
                    self._wake(e, t)
                return e
        for e in engines:
            if e.cap_state == FALLING:
                if commit:
                    e.wake_after = True
                return e
        if up:  # booting nodes: the first engine up
            return min(up, key=lambda e: (e.cap_end_s, e.pending_tokens, e.index))
        for node in range(self.n_nodes):
            if self.node_state[node] == NODE_OFF:
                if commit:
                    self._boot(node, t)
                return engines[node * self.epn]
        return engines[0]  # (every engine awake but fault-drained: the datacenter's own rule)

    def arrival_delay_s(self, t: float) -> float:
        """Capacity delay a request reaching the datacenter now would see (0 when some engine
        accepts work)."""
        if self.dc.accepting_now():
            return 0.0
        return self.ready_delay_s(self.engine_for_arrival(t, commit=False), t)

    def reset_after_outage(self) -> None:
        """The datacenter came back up: every engine awake, every node on (the ledger was reset by
        the datacenter); the targets stay and the next reconcile applies them."""
        self.node_state = [NODE_ON] * self.n_nodes
        self.node_asleep = [0] * self.n_nodes
        self.node_booting = [0] * self.n_nodes

    def node_counts(self) -> tuple[int, int, int, int]:
        """Nodes (ON, STANDBY, OFF, BOOTING)."""
        ns = self.node_state
        return ns.count(NODE_ON), ns.count(NODE_STANDBY), ns.count(NODE_OFF), ns.count(NODE_BOOTING)

