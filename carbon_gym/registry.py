"""The one policy registry: policy name -> factory, for every layer of the project.

Every scheduler that the CLI, the evaluation harness, training and the benchmarks can run by
name is registered here::

    import carbon_gym

    policy = carbon_gym.make_policy("milp", env, time_limit_s=0.5)   # solvers' facility MILP
    carbon_gym.available_policies()      # ['rr', 'greedy', ..., 'clairvoyant', 'learned']

Three forms of name are accepted by :func:`make_policy`:

* a registered name or one of its aliases (``rr`` = ``round-robin``, ``milp`` =
  ``facility-milp``, ...). The registered name is the short one used in result tables
  (:func:`canonical_policy_name` maps an alias to it);
* ``PREFIX:ARGUMENT`` for a registered prefix, e.g. ``learned:runs/ppo/best.npz`` (a trained
  checkpoint; :func:`register_policy_prefix`);
* ``package.module:Class`` for a policy class of the user's own on the Python path: the class
  (or a factory function) is imported and built as ``Class(env, **kwargs)`` when its
  constructor takes an ``env`` parameter (or a required first positional one), else as
  ``Class(**kwargs)``; it must have an ``act`` method.

A factory is ``factory(env, **kwargs) -> policy`` (``env`` may be None); a prefix factory is
``factory(argument, env, **kwargs)``. Keyword arguments that a factory rejects (``TypeError``)
become a :class:`~carbon_gym.errors.ConfigError` naming the policy.

**How the layers register.** ``carbon_gym`` is the bottom layer and imports none of
``solvers``, ``train`` or ``eval``: it registers only its own round-robin (``rr``). Each
other layer declares a registration function in the entry-point group
:data:`ENTRY_POINT_GROUP` (``carbon_gym.policies``, in ``pyproject.toml``), and the registry
loads that group lazily, once per process, the first time a name is not found (and whenever
the full list is asked for). Entry points rather than registration on import because the
harness builds policies by name in fresh worker processes (spawned pools, Ray) that have
imported nothing but ``carbon_gym``: ``make_policy("milp", env)`` must work there, and in a
user's script after a plain ``import carbon_gym``, without carbon_gym naming its upper layers
and without every ``import carbon_gym`` paying for them. The registration functions import
nothing heavy (each factory imports its scheduler when called), so loading the group is cheap
(about 10 ms) and a missing optional dependency (pyomo, torch) only fails the policies that
need it, when they are built. A third-party package can add policies the same way.
Policies registered at run time with :func:`register_policy` exist only in the process that
registered them; the ``module:Class`` form reaches worker processes too.
"""

from __future__ import annotations

import importlib
import inspect
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ConfigError

__all__ = [
    "ENTRY_POINT_GROUP", "PolicyInfo", "register_policy", "register_policy_prefix", "unregister_policy",
    "make_policy", "available_policies", "default_policies", "available_prefixes", "policy_info",
    "canonical_policy_name", "check_policy_name", "split_prefix", "split_autoscaler", "is_module_form", "load_policy_plugins",
]

#: Entry-point group whose functions register each layer's policies (see the module docstring).
ENTRY_POINT_GROUP = "carbon_gym.policies"

PolicyFactory = Callable[..., Any]


@dataclass(frozen=True)
class PolicyInfo:
    """One registry entry.

    Attributes:
        name: the registered (table) name, or the prefix of a prefix entry.
        factory: ``factory(env, **kwargs)``; for a prefix entry ``factory(argument, env, **kwargs)``.
        aliases: other names accepted for it (solvers' long names, e.g. ``facility-milp``).
        doc: one line for listings (``carbon-gym policies``).
        in_all: part of ``--policies all`` (:func:`default_policies`).
        check: optional ``check(argument)`` raising :class:`ConfigError` when the policy cannot
            be built here (missing checkpoint or extra); ``argument`` is ``""`` for a name.
        source: top-level package of the code that registered it (``carbon_gym``, ``solvers``...).
        prefix: whether this is a prefix entry (``NAME:ARGUMENT``).
    """

    name: str
    factory: PolicyFactory
    aliases: tuple[str, ...] = ()
    doc: str = ""
    in_all: bool = True
    check: Callable[[str], None] | None = None
    source: str = ""
    prefix: bool = False


_names: dict[str, PolicyInfo] = {}  # registration order
_aliases: dict[str, str] = {}  # alias -> registered name
_prefixes: dict[str, PolicyInfo] = {}
_plugins_loaded = False
_plugin_errors: dict[str, str] = {}
_lock = threading.RLock()


def _source(factory: Any) -> str:
    return str(getattr(factory, "__module__", "") or "").split(".")[0]


def _check_new(name: str, replace: bool) -> None:
    if not isinstance(name, str) or not name or ":" in name or name != name.strip():
        raise ConfigError("policy", f"bad policy name {name!r}", allowed="a non-empty name without ':' or spaces")
    if not replace and (name in _names or name in _aliases or name in _prefixes):
        raise ConfigError("policy", f"{name!r} is already registered (pass replace=True to replace it)")


def register_policy(
    name: str,
    factory: PolicyFactory,
    *,
    aliases: tuple[str, ...] | list[str] = (),
    doc: str = "",
    in_all: bool = True,
    check: Callable[[str], None] | None = None,
    replace: bool = False,
) -> PolicyInfo:
    """Register ``factory(env, **kwargs)`` as policy ``name`` (and its ``aliases``).

    ``in_all=False`` keeps it out of ``--policies all`` (a bound or a learned agent that must be
    named explicitly). Registering a taken name or alias raises :class:`ConfigError` unless
    ``replace`` (then the old entry and its aliases are dropped first).
    """
    if not callable(factory):
        raise ConfigError("policy", f"factory of {name!r} is not callable: {factory!r}")
    with _lock:
        if replace:
            unregister_policy(name)
            for a in aliases:
                _aliases.pop(a, None)
        _check_new(name, replace)
        for a in aliases:
            _check_new(a, replace)
        info = PolicyInfo(name=name, factory=factory, aliases=tuple(aliases), doc=doc, in_all=bool(in_all),
                          check=check, source=_source(factory))
        _names[name] = info
        for a in aliases:
            _aliases[a] = name
        return info


def register_policy_prefix(
    prefix: str,
    factory: PolicyFactory,
    *,
    doc: str = "",
    check: Callable[[str], None] | None = None,
    replace: bool = False,
) -> PolicyInfo:
    """Register ``factory(argument, env, **kwargs)`` for names ``PREFIX:ARGUMENT``
    (``register_policy_prefix("learned", f)`` serves ``learned:runs/x.npz``). A prefix never
    contains a dot, so ``package.module:Class`` stays the user-class form."""
    if not callable(factory):
        raise ConfigError("policy", f"factory of prefix {prefix!r} is not callable: {factory!r}")
    if not isinstance(prefix, str) or not prefix or "." in prefix or ":" in prefix or prefix != prefix.strip():
        raise ConfigError("policy", f"bad policy prefix {prefix!r}", allowed="a non-empty name without '.', ':' or spaces")
    with _lock:
        if prefix in _prefixes and not replace:
            raise ConfigError("policy", f"prefix {prefix!r} is already registered (pass replace=True to replace it)")
        info = PolicyInfo(name=prefix, factory=factory, doc=doc, in_all=False, check=check,
                          source=_source(factory), prefix=True)
        _prefixes[prefix] = info
        return info


def unregister_policy(name: str) -> None:
    """Remove a registered name (with its aliases) or prefix; unknown names are ignored."""
    with _lock:
        info = _names.pop(name, None)
        if info is not None:
            for a in info.aliases:
                _aliases.pop(a, None)
        _prefixes.pop(name, None)


def load_policy_plugins(*, force: bool = False) -> dict[str, str]:
    """Run every registration function of :data:`ENTRY_POINT_GROUP` (once per process unless
    ``force``); returns ``{entry point: error}`` for those that failed to load."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded and not force:
            return dict(_plugin_errors)
        _plugins_loaded = True
        from importlib.metadata import entry_points

        eps = list(entry_points(group=ENTRY_POINT_GROUP))
        seen: set[str] = set()
        for ep in sorted(eps, key=lambda e: (e.name, e.value)):  # deterministic order
            if ep.value in seen:  # the same function declared twice (e.g. two installs)
                continue
            seen.add(ep.value)
            try:
                register = ep.load()
                register()
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not hide the others
                _plugin_errors[ep.name] = f"{type(exc).__name__}: {exc}"
        return dict(_plugin_errors)


def _ensure_plugins() -> None:
    if not _plugins_loaded:
        load_policy_plugins()


def _lookup(name: str) -> PolicyInfo | None:
    key = _aliases.get(name, name)
    return _names.get(key)


def split_prefix(name: str) -> tuple[str, str] | None:
    """``(prefix, argument)`` when ``name`` is ``PREFIX:ARGUMENT`` for a registered prefix."""
    head, sep, arg = str(name).partition(":")
    if not sep:
        return None
    if head not in _prefixes:
        _ensure_plugins()
    return (head, arg) if head in _prefixes else None


def is_module_form(name: str) -> bool:
    """Whether ``name`` is ``package.module:Attribute`` (not a registered prefix)."""
    head, sep, attr = str(name).partition(":")
    return bool(sep and head and attr) and split_prefix(name) is None


def split_autoscaler(name: str) -> tuple[str, str] | None:
    """``(routing policy, autoscaler)`` when ``name`` is ``POLICY+AUTOSCALER`` with a registered
    autoscaler (:mod:`carbon_gym.autoscalers`), e.g. ``rr+reactive``; else None."""
    from .autoscalers import available_autoscalers

    head, sep, tail = str(name).rpartition("+")
    if sep and head and tail in available_autoscalers():
        return head, tail
    return None


def policy_info(name: str) -> PolicyInfo:
    """The entry of a registered name, alias or ``PREFIX:...`` name (for ``POLICY+AUTOSCALER``:
    the routing policy's); :class:`ConfigError` if unknown."""
    both = split_autoscaler(name)
    if both is not None:
        return policy_info(both[0])
    info = _lookup(name)
    if info is None and ":" not in str(name):
        _ensure_plugins()
        info = _lookup(name)
    if info is not None:
        return info
    pre = split_prefix(name)
    if pre is not None:
        return _prefixes[pre[0]]
    raise _unknown(name)


def canonical_policy_name(name: str) -> str:
    """Table name of a policy: an alias becomes its registered name (``facility-milp`` ->
    ``milp``); registered names, ``PREFIX:...`` and ``module:Class`` forms and unknown names
    are returned unchanged."""
    name = str(name)
    both = split_autoscaler(name)
    if both is not None:
        return f"{canonical_policy_name(both[0])}+{both[1]}"
    if ":" in name:
        return name
    info = _lookup(name)
    if info is None:
        _ensure_plugins()
        info = _lookup(name)
    return info.name if info is not None else name


def _ordered() -> list[PolicyInfo]:
    _ensure_plugins()
    entries = list(_names.values())
    return [e for e in entries if e.in_all] + [e for e in entries if not e.in_all]


def available_policies() -> list[str]:
    """Every registered name: those in ``--policies all`` first (registration order), then the
    others (e.g. ``clairvoyant``, ``learned``). Prefix forms: :func:`available_prefixes`."""
    return [e.name for e in _ordered()]


def default_policies() -> list[str]:
    """What ``--policies all`` means: every registered name with ``in_all`` (not the
    clairvoyant bound, not learned agents, which are named explicitly)."""
    return [e.name for e in _ordered() if e.in_all]


def available_prefixes() -> list[str]:
    """Registered prefixes (``learned``, ``ppo``: names ``PREFIX:ARGUMENT``)."""
    _ensure_plugins()
    return list(_prefixes)


def allowed_names() -> list[str]:
    """Everything a user may type, for error messages: names, aliases, prefix and class forms."""
    _ensure_plugins()
    out = available_policies()
    out += [f"{a} (= {n})" for a, n in _aliases.items()]
    out += [f"{p}:<argument>" for p in _prefixes]
    out.append("package.module:Class")
    return out


def _unknown(name: str) -> ConfigError:
    msg = f"unknown policy {name!r}"
    if _plugin_errors:
        msg += " (policy plugins that failed to load: " + "; ".join(f"{k}: {v}" for k, v in _plugin_errors.items()) + ")"
    return ConfigError("policy", msg, allowed=allowed_names())


def _import_attribute(name: str) -> Any:
    """The object named by ``package.module:Attr`` (``Attr`` may be dotted)."""
    mod_name, _, attr = str(name).partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or mod_name
        raise ConfigError("policy", f"{name!r}: no module {missing!r} on the Python path "
                          f"(cwd {os.getcwd()!r})", allowed="package.module:Class with the module importable") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed while importing
        raise ConfigError("policy", f"{name!r}: importing module {mod_name!r} failed: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError("policy", f"{name!r}: module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _wants_env(fn: Any) -> bool:
    """Whether a constructor / factory takes the env: a parameter named ``env``, or a required
    first positional parameter."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.name == "env" for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return bool(positional) and positional[0].default is inspect.Parameter.empty


def _module_factory(name: str) -> PolicyFactory:
    obj = _import_attribute(name)
    if inspect.isclass(obj):
        if not callable(getattr(obj, "act", None)):
            raise ConfigError("policy", f"{name!r}: class {obj.__name__!r} has no act(observation, info) method",
                              allowed="a class implementing carbon_gym.policy.Policy")
    elif not callable(obj):
        raise ConfigError("policy", f"{name!r} is neither a class nor a factory function: {type(obj).__name__}")
    wants_env = _wants_env(obj)

    def factory(env: Any = None, **kwargs: Any) -> Any:
        if wants_env:
            if "env" in kwargs:
                raise TypeError("'env' is passed by the registry, not as a keyword argument")
            return obj(env, **kwargs)
        return obj(**kwargs)

    return factory


def check_policy_name(name: str) -> str:
    """Validate ``name`` without building the policy and return its table name: a registered
    name or alias, a registered prefix form (its ``check`` run on the argument) or an
    importable ``module:Class`` with an ``act`` method. Raises :class:`ConfigError`."""
    name = str(name).strip()
    both = split_autoscaler(name)
    if both is not None:
        return f"{check_policy_name(both[0])}+{both[1]}"
    if ":" not in name:
        info = policy_info(name)
        if info.check is not None:
            info.check("")
        return info.name
    pre = split_prefix(name)
    if pre is not None:
        info = _prefixes[pre[0]]
        if not pre[1]:
            raise ConfigError("policy", f"{name!r}: missing the argument after {pre[0] + ':'!r}")
        if info.check is not None:
            info.check(pre[1])
        return name
    if is_module_form(name):
        _module_factory(name)
        return name
    raise _unknown(name)


def make_policy(name: str, env: Any = None, **kwargs: Any) -> Any:
    """Build policy ``name`` (a registered name or alias, ``PREFIX:ARGUMENT`` or
    ``package.module:Class``) for ``env``; ``kwargs`` go to its factory, e.g.
    ``make_policy("milp", env, time_limit_s=0.5)``. Raises :class:`ConfigError` for an unknown
    name or arguments the factory rejects."""
    name = str(name).strip()
    both = split_autoscaler(name)
    if both is not None:
        return _composed(name, both[0], both[1], env, kwargs)
    if ":" not in name:
        info = policy_info(name)
        build: Callable[[], Any] = lambda: info.factory(env, **kwargs)  # noqa: E731
    else:
        pre = split_prefix(name)
        if pre is not None:
            pinfo = _prefixes[pre[0]]
            build = lambda: pinfo.factory(pre[1], env, **kwargs)  # noqa: E731
        elif is_module_form(name):
            mod_factory = _module_factory(name)
            build = lambda: mod_factory(env, **kwargs)  # noqa: E731
        else:
            raise _unknown(name)
    try:
        policy = build()
    except TypeError as exc:
        raise ConfigError("policy", f"bad arguments for {name!r}: {exc}") from None
    if not callable(getattr(policy, "act", None)):
        raise ConfigError("policy", f"{name!r} built {type(policy).__name__!r}, which has no act(observation, info) method")
    return policy


def _composed(name: str, router: str, scaler: str, env: Any, kwargs: dict[str, Any]) -> Any:
    """``POLICY+AUTOSCALER``: the routing policy (built with ``kwargs``) and the autoscaler (with
    the scenario's ``[capacity.params]``) composed (:class:`~carbon_gym.autoscalers.CapacityComposedPolicy`)."""
    from .autoscalers import CapacityComposedPolicy, make_autoscaler

    base = getattr(env, "unwrapped", env)
    section = getattr(getattr(base, "scenario", None), "capacity", None)
    params = section.params_dict() if section is not None else {}
    composed = CapacityComposedPolicy(None, None, env, name)  # checks capacity.control first
    composed.router = make_policy(router, env, **kwargs)
    composed.autoscaler = make_autoscaler(scaler, env, **params)
    return composed


def _round_robin(env: Any = None, **kwargs: Any) -> Any:
    from .policy import RoundRobinPolicy

    return RoundRobinPolicy(**kwargs)


register_policy("rr", _round_robin, aliases=("round-robin",),
                doc="reference: cycles over the allowed datacenters, one request at a time")
