"""The plugin manager and the component registry built from it.

``make_registry()`` builds a fresh pluggy manager, loads every entry point of the group
``tailkit`` (built-ins included: they are registered exactly like third-party plugins), calls
each ``register_*`` hook with a ``register`` callback, and keeps which plugin registered what.
A plugin that fails to import is recorded and reported; the others still load.

Environment:
    TAILKIT_LOAD_PLUGINS   comma-separated entry-point names to load (default: all)
    TAILKIT_TRACE_PLUGINS  set to 1 to print every hook call to stderr
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import inspect
import os
import re
import sys
import threading
import traceback
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, cast

import pluggy

from tailkit import hookspecs
from tailkit.errors import (
    InvalidParameterError,
    PluginError,
    UnknownComponentError,
    did_you_mean,
)
from tailkit.validation import describe_options, validate_options

KINDS = ("datasets", "featurizers", "samplers", "losses", "models")
SINGULAR = {
    "datasets": "dataset",
    "featurizers": "featurizer",
    "samplers": "sampler",
    "losses": "loss",
    "models": "model",
}
PLURAL = {singular: kind for kind, singular in SINGULAR.items()}


@dataclass(frozen=True)
class OptionInfo:
    """One option a component takes in ``params.yaml``, from its signature and docstring."""

    name: str
    type: str  # as the errors word it: "a number", "one of 'mean', 'sum'", ...
    default: str  # as YAML writes it; "required" when there is none
    allowed: str  # the range or set of ``constraints``; "" when none
    doc: str  # one line of the docstring about it; "" when it says nothing


@dataclass(frozen=True)
class Component:
    """The info record of one registered component, made once at registration: what it is,
    where it came from, the options it takes and what it declares about itself.

    ``traits`` holds the kind's declared facts with the protocol's defaults filled in
    (:func:`declared_traits`): a loss's batch ``modes`` and ``multilabel``;
    a sampler's ``conditional``, ``uses_negatives`` and ``conditions_on``; a
    featurizer's ``accepts`` and ``output``; a model's ``input_kind``, ``learner`` and
    ``requires``. The core, ``tailkit list``/``options``/``plugins``
    and the contract kit read them here instead of probing the class.

    ``factory`` is imported on first use: a record read back from the catalog
    (:mod:`tailkit.catalog`) imports its module then, through ``reference``, so that a
    stage imports the components it builds and no others.
    """

    kind: str
    name: str
    description: str
    plugin: str
    distribution: str
    version: str
    aliases: tuple[str, ...] = ()
    options: tuple[OptionInfo, ...] = ()
    # a read-only mapping is unhashable: left out of the hash so a record stays hashable
    traits: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    #: "module:qualname" of the code that defines the factory (decorators unwrapped): what the
    #: component's fingerprint hashes (:mod:`tailkit.pipeline.codehash`).
    origin: str = ""
    #: "module:qualname" that imports back to the registered factory itself; None for one that
    #: cannot be named so (a lambda, a closure, a ``functools.partial``).
    reference: str | None = None
    #: The distributions whose versions shape what the factory builds (its ``requires``).
    requires: tuple[str, ...] = ()
    loader: Callable[[], Callable[..., Any]] = field(
        default=lambda: _no_factory(), compare=False, repr=False
    )

    @functools.cached_property
    def factory(self) -> Callable[..., Any]:
        """What builds the component (usually its class)."""
        return self.loader()

    @property
    def modes(self) -> tuple[str, ...]:
        """The batch modes a loss takes ("full", "sampled"); empty for other kinds."""
        return tuple(self.traits.get("modes", ()))

    def info(self) -> dict[str, Any]:
        """The record as JSON (``tailkit plugins --components``; the catalog's records)."""
        return {
            "kind": SINGULAR[self.kind],
            "name": self.name,
            "description": self.description,
            "plugin": self.plugin,
            "distribution": self.distribution,
            "version": self.version,
            "aliases": list(self.aliases),
            "options": [vars(o) for o in self.options],
            "traits": dict(self.traits),
            "origin": self.origin,
            "reference": self.reference,
            "requires": list(self.requires),
        }

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> Component:
        """The record :meth:`info` wrote, its factory imported on first use through
        ``reference`` (or, for one without, from the registry that imports every plugin)."""
        kind = PLURAL[info["kind"]]
        name = info["name"]
        return cls(
            kind=kind,
            name=name,
            description=info["description"],
            plugin=info["plugin"],
            distribution=info["distribution"],
            version=info["version"],
            aliases=tuple(info["aliases"]),
            options=tuple(OptionInfo(**o) for o in info["options"]),
            traits=MappingProxyType(dict(info["traits"])),
            origin=info["origin"],
            reference=info["reference"],
            requires=tuple(info["requires"]),
            loader=functools.partial(_load_factory, kind, name, info["reference"]),
        )


def _no_factory() -> Callable[..., Any]:
    raise TypeError("this component record was made without a factory")


def _load_factory(kind: str, name: str, reference: str | None) -> Callable[..., Any]:
    """The factory ``reference`` names, imported; the full registry's when it names none or
    its import fails (that registry then reports the plugin as it reports any that fails, and
    the error names the import that failed)."""
    failure: Exception | None = None
    if reference is not None:
        module, _, qualname = reference.partition(":")
        try:
            found: Any = importlib.import_module(module)
            for part in qualname.split("."):
                found = getattr(found, part)
            return cast(Callable[..., Any], found)
        except Exception as exc:  # noqa: BLE001 -- the full registry says what went wrong
            failure = exc
    try:
        return full_registry().get(kind, name, f"{SINGULAR[kind]} {name!r}").factory
    except UnknownComponentError:
        if failure is None:
            raise
        raise PluginError(
            f"{SINGULAR[kind]} {name!r}: importing {reference} failed: "
            f"{type(failure).__name__}: {failure}"
        ) from failure


def _origin(factory: Any) -> str:
    """ "module:qualname" of the code behind ``factory`` (decorators unwrapped)."""
    code = inspect.unwrap(factory)
    return f"{code.__module__}:{getattr(code, '__qualname__', repr(code))}"


def _reference(factory: Any) -> str | None:
    """ "module:qualname" that imports back to ``factory`` itself, else None. Read at
    registration, when the module is imported already."""
    module, qualname = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if not module or not qualname or "<" in qualname or module not in sys.modules:
        return None
    found: Any = sys.modules[module]
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is factory else None


@dataclass
class PluginRecord:
    name: str
    distribution: str
    version: str
    entry_point: str = ""  # "module:attr", as the distribution's metadata declares it
    error: str | None = None
    registered: dict[str, list[str]] = field(default_factory=dict)


def unknown_component(
    kind: str,
    name: Any,
    known: Iterable[str],
    primary: Sequence[str],
    key: str,
    failed: Sequence[str] = (),
) -> UnknownComponentError:
    """The one-line error for a name no component of ``kind`` has: the closest of ``known``
    (names and aliases), the ``primary`` names available, and the plugins that failed."""
    available = ", ".join(primary) or "(none installed)"
    hint = f"; plugins that failed to load: {', '.join(failed)}" if failed else ""
    return UnknownComponentError(
        f"{key}: unknown {SINGULAR[kind]} {name!r}{did_you_mean(name, known)}; "
        f"available: {available}{hint}"
    )


def _first_doc_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def option_doc(doc: str, name: str) -> str:
    """The one line a docstring gives option ``name``: its entry in an ``Options:`` or
    ``Args:`` list (``name: text``), else the first sentence that quotes it as ``name`` or
    ``name=...``; "" when it says nothing about it."""
    entry = re.search(
        rf"^\s*`*{re.escape(name)}`*\s*(?:\([^)]*\))?\s*:\s+(\S.*)$", doc, re.MULTILINE
    )
    if entry:
        return entry.group(1).strip()
    flat = " ".join(doc.split())
    for sentence in re.split(r"(?<=[.;])\s+(?=[A-Z`(])", flat):
        if re.search(rf"``{re.escape(name)}(``|\s*=)", sentence):
            return sentence if len(sentence) <= 160 else sentence[:157].rstrip() + "..."
    return ""


def _options(factory: Callable[..., Any]) -> tuple[OptionInfo, ...]:
    doc = inspect.getdoc(factory) or ""
    return tuple(
        OptionInfo(**row, doc=option_doc(doc, row["name"])) for row in describe_options(factory)
    )


def _traits(kind: str, name: str, factory: Callable[..., Any]) -> Mapping[str, Any]:
    """The component's declared facts; a loss that takes no batch type is refused here, so a
    plugin learns at load time, not from a ``None`` deep in a training step."""
    from tailkit.components import BATCH_TYPES

    traits = declared_traits(kind, factory)
    if kind == "losses" and not traits["modes"]:
        kinds = " or ".join(t.__name__ for t in BATCH_TYPES.values())
        legacy = "; the `mode` attribute is no longer read" if hasattr(factory, "mode") else ""
        raise TypeError(
            f"loss {name!r}: its forward(batch) must be annotated with the batch type it takes, "
            f"{kinds} (or both as a union), imported from tailkit.components{legacy}"
        )
    return MappingProxyType(traits)


class Registry:
    """Components per kind, built from a plugin manager's ``register_*`` hooks."""

    def __init__(self, pm: pluggy.PluginManager | None, records: dict[str, PluginRecord]):
        self.pm = pm
        self.plugins = records
        self._components: dict[str, dict[str, Component]] = {k: {} for k in KINDS}
        if pm is None:
            return  # filled by from_catalog
        for kind in KINDS:
            hook = getattr(pm.hook, f"register_{kind}")
            for impl in reversed(hook.get_hookimpls()):  # registration order
                plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
                record = records.setdefault(plugin_name, PluginRecord(plugin_name, plugin_name, ""))
                if record.error is None:
                    self._call_register(kind, impl.function, record)

    @classmethod
    def from_catalog(
        cls, plugins: list[dict[str, Any]], components: list[dict[str, Any]]
    ) -> Registry:
        """The registry the catalog's records describe (:mod:`tailkit.catalog`), without
        importing any plugin: each component's module is imported when its factory is used."""
        records = {
            p["name"]: PluginRecord(
                p["name"],
                p["distribution"],
                p["version"],
                registered={kind: list(names) for kind, names in p["registered"].items()},
            )
            for p in plugins
        }
        registry = cls(None, records)
        for info in components:
            component = Component.from_info(info)
            for key in (component.name, *component.aliases):
                registry._components[component.kind][key] = component
        return registry

    def _call_register(self, kind: str, hook: Callable[..., None], record: PluginRecord) -> None:
        """One plugin's ``register_<kind>`` hook; if it raises, its components of that call
        are withdrawn and the plugin is reported like one that failed to import."""
        before = {k: dict(table) for k, table in self._components.items()}
        done = {k: list(v) for k, v in record.registered.items()}
        if _tracing():
            print(f"tailkit: calling register_{kind} of plugin {record.name!r}", file=sys.stderr)
        try:
            hook(register=self._registrar(kind, record))
        except PluginError:
            raise  # a name clash between two plugins: the user must choose, not a warning
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - as for a failed import
            self._components, record.registered = before, done
            _failed(record, f"register_{kind} failed", exc)

    def _registrar(self, kind: str, record: PluginRecord) -> Callable[..., None]:
        def register(
            name: str,
            factory: Callable[..., Any],
            description: str | None = None,
            aliases: Sequence[str] = (),
        ) -> None:
            table = self._components[kind]
            for key in (name, *aliases):
                if key in table:
                    other = table[key].plugin
                    raise PluginError(
                        f"{SINGULAR[kind]} {key!r} is registered by both plugin {other!r} and "
                        f"plugin {record.name!r}; uninstall one, or choose with "
                        "TAILKIT_LOAD_PLUGINS"
                    )
            component = Component(
                kind=kind,
                name=name,
                description=description or _first_doc_line(factory),
                plugin=record.name,
                distribution=record.distribution,
                version=record.version,
                aliases=tuple(aliases),
                options=_options(factory),
                traits=_traits(kind, name, factory),
                origin=_origin(factory),
                reference=_reference(factory),
                requires=tuple(getattr(inspect.unwrap(factory), "requires", ())),
                loader=lambda: factory,
            )
            for key in (name, *aliases):
                table[key] = component
            record.registered.setdefault(kind, []).append(name)

        return register

    def names(self, kind: str) -> list[str]:
        """Primary names (no aliases) of the components of ``kind``, sorted."""
        return sorted({c.name for c in self._components[kind].values()})

    def components(self, kind: str) -> list[Component]:
        return [self._components[kind][n] for n in self.names(kind)]

    def get(self, kind: str, name: Any, key: str) -> Component:
        """Look a component up by name; ``key`` is the params path used in the error."""
        table = self._components[kind]
        if not isinstance(name, str) or name not in table:
            failed = [r.name for r in self.plugins.values() if r.error]
            raise unknown_component(kind, name, table, self.names(kind), key, failed)
        return table[name]

    def build(self, kind: str, spec: Any, key: str, *runtime: Any) -> Any:
        """Build a component from its params mapping ``{name: ..., **options}``.

        ``runtime`` are positional inputs from the core (e.g. a model's input dimension).
        """
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, Mapping) or "name" not in spec:
            raise InvalidParameterError(
                f"{key}: got {spec!r}; expected a mapping with a 'name' key"
            )
        component = self.get(kind, spec["name"], f"{key}.name")
        options = {k: v for k, v in spec.items() if k != "name"}
        options = validate_options(key, component.factory, options)
        try:
            return component.factory(*runtime, **options)
        except InvalidParameterError:
            raise
        except (ValueError, TypeError) as exc:
            raise InvalidParameterError(f"{key}: {exc}") from exc

    def provenance(self, kind: str, spec: Any) -> str:
        """``"<name> (<distribution> <version>)"`` for the component a params mapping names."""
        name = spec if isinstance(spec, str) else spec["name"]
        component = self._components[kind][name]
        return f"{component.name} ({component.distribution} {component.version})"

    def report(self, include_builtin: bool = True) -> list[dict[str, Any]]:
        """The JSON-able list ``tailkit plugins`` prints and every model stores."""
        out = []
        for record in sorted(self.plugins.values(), key=lambda r: r.name):
            if not include_builtin and record.distribution == "tailkit":
                continue
            entry: dict[str, Any] = {
                "name": record.name,
                "distribution": record.distribution,
                "version": record.version,
                "registered": {k: sorted(v) for k, v in sorted(record.registered.items())},
            }
            if record.error:
                entry["error"] = record.error
            out.append(entry)
        return out


def _entry_points(group: str) -> Iterable[importlib.metadata.EntryPoint]:
    seen: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=group):
        dist = ep.dist.name if ep.dist else "?"
        if ep.name in seen:
            # Editable installs can expose the same distribution twice on sys.path: skip it.
            # Two distributions claiming one plugin name would silently shadow each other.
            if seen[ep.name] != dist:
                raise PluginError(
                    f"plugin name {ep.name!r} is declared by both distribution "
                    f"{seen[ep.name]!r} and {dist!r}; uninstall one"
                )
            continue
        seen[ep.name] = dist
        yield ep


#: Seconds a plugin's import may take before tailkit names it on stderr: a plugin that hangs
#: at import would otherwise leave every command silent (``TAILKIT_SLOW_IMPORT_SECONDS``).
SLOW_IMPORT_SECONDS = 5.0


@contextlib.contextmanager
def _named_if_slow(record: PluginRecord) -> Iterator[None]:
    """Name the plugin being imported if its import outlasts the limit (it keeps running: a
    slow import is allowed, a silent one is not)."""
    try:
        limit = float(os.environ.get("TAILKIT_SLOW_IMPORT_SECONDS", SLOW_IMPORT_SECONDS))
    except ValueError:
        limit = SLOW_IMPORT_SECONDS
    where = f"{record.distribution} {record.version}".strip()
    timer = threading.Timer(
        limit,
        lambda: print(
            f"tailkit: still importing plugin {record.name!r} ({where}, entry point "
            f"{record.name} = {record.entry_point}) after {limit:g} s; TAILKIT_LOAD_PLUGINS "
            "names the plugins to load",
            file=sys.stderr,
            flush=True,
        ),
    )
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _tracing() -> bool:
    return bool(os.environ.get("TAILKIT_TRACE_PLUGINS"))


def _failed(record: PluginRecord, what: str, exc: BaseException) -> None:
    """Record and report a plugin failure in one line naming its distribution, version and
    entry point; the whole traceback under TAILKIT_TRACE_PLUGINS=1."""
    detail = (
        f"SystemExit({exc.code!r}) (it called sys.exit)"
        if isinstance(exc, SystemExit)
        else (f"{type(exc).__name__}: {exc}")
    )
    record.error = detail.splitlines()[0] if detail.strip() else type(exc).__name__
    where = f"{record.distribution} {record.version}".strip()
    entry = f", entry point {record.name} = {record.entry_point}" if record.entry_point else ""
    print(
        f"Warning: plugin {record.name!r} ({where}{entry}) {what}: {record.error}; its "
        "components are unavailable (TAILKIT_TRACE_PLUGINS=1 shows the traceback)",
        file=sys.stderr,
    )
    if _tracing():
        traceback.print_exception(exc, file=sys.stderr)


def make_plugin_manager(
    load_entrypoints: bool = True, extra_plugins: Sequence[tuple[str, object]] = ()
) -> tuple[pluggy.PluginManager, dict[str, PluginRecord]]:
    """A fresh manager with the hook specs, entry-point plugins and ``extra_plugins``."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    records: dict[str, PluginRecord] = {}
    selected = os.environ.get("TAILKIT_LOAD_PLUGINS")
    wanted = None if selected is None else {s.strip() for s in selected.split(",") if s.strip()}
    if load_entrypoints:
        for ep in _entry_points(hookspecs.PROJECT):
            dist = ep.dist.name if ep.dist else "?"
            version = ep.dist.version if ep.dist else "?"
            is_builtin = dist == "tailkit"
            if wanted is not None and not is_builtin and ep.name not in wanted:
                continue
            record = PluginRecord(ep.name, dist, version, ep.value)
            records[ep.name] = record
            try:
                with _named_if_slow(record):
                    plugin = ep.load()
                pm.register(plugin, name=ep.name)
            # a broken plugin must not take the others down; SystemExit too: a plugin calling
            # sys.exit at import would otherwise end tailkit silently with its code
            except (Exception, SystemExit) as exc:  # noqa: BLE001
                _failed(record, "failed to load", exc)
    for name, plugin in extra_plugins:
        records[name] = PluginRecord(name, name, "")
        pm.register(plugin, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError(f"plugin {exc.plugin!r} implements an unknown hook: {exc}") from exc
    if _tracing():
        pm.trace.root.setwriter(lambda msg: print(msg, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm, records


def make_registry(
    load_entrypoints: bool = True, extra_plugins: Sequence[tuple[str, object]] = ()
) -> Registry:
    """Build a fresh registry (tests use this with their own plugins)."""
    pm, records = make_plugin_manager(load_entrypoints, extra_plugins)
    return Registry(pm, records)


@functools.cache
def get_plugin_manager() -> tuple[pluggy.PluginManager, dict[str, PluginRecord]]:
    """The process-wide plugin manager with the installed plugins loaded, no hook called yet:
    the CLI asks it for plugin commands without building the registry, whose ``register_*``
    calls import every component (torch, scikit-learn: seconds)."""
    return make_plugin_manager()


@functools.cache
def full_registry() -> Registry:
    """The process-wide registry built by calling every installed plugin's hooks, which
    imports every component (torch and scikit-learn among them: seconds)."""
    return Registry(*get_plugin_manager())


@functools.cache
def get_registry() -> Registry:
    """The process-wide registry of installed plugins: from the catalog's cached records when
    they are current (a component's module is then imported when it is built), else
    :func:`full_registry`, whose records the catalog keeps for the next process."""
    from tailkit.catalog import read_or_build

    catalog, read_back = read_or_build()  # on a miss it builds full_registry() and keeps it
    if read_back:
        return Registry.from_catalog(catalog.plugins, catalog.components)
    return full_registry()


def declared_traits(kind: str, factory: Any) -> dict[str, Any]:
    """What a component of ``kind`` declares about itself as class attributes, with the
    protocol's defaults filled in: read once, at registration, into its info record
    (:class:`Component`). Values are JSON-able."""
    from tailkit.components import Sampler

    cls = _returned_class(factory)
    if kind == "losses":
        return {
            "modes": list(batch_modes(cls)) if cls is not None else [],
            "multilabel": bool(getattr(cls, "multilabel", False)),
        }
    if kind == "samplers":
        return {
            name: getattr(cls, name, getattr(Sampler, name))
            # not `shared`: uniform and unigram take it as an option, so it is per instance
            for name in ("conditional", "uses_negatives", "conditions_on")
        }
    if kind == "featurizers":
        return {"accepts": list(featurizer_accepts(cls)), "output": featurizer_output(cls)}
    if kind == "models":
        learner = cls is not None and is_learner(cls)
        return {
            "input_kind": model_input_kind(cls),
            "learner": learner,
            "requires": list(getattr(cls, "requires", ())) if learner else [],
        }
    return {}  # a dataset's facts (propensity) may depend on its options: read per instance


# What a component declares, read with the contract's defaults (declared_traits, the core).

#: Jain et al.'s default propensity constants (A, B), for a dataset that declares none.
DEFAULT_PROPENSITY = (0.55, 1.5)


def dataset_propensity(dataset: Any) -> tuple[float, float]:
    """The (A, B) a dataset declares (``propensity``), else :data:`DEFAULT_PROPENSITY`.
    subsample records it in the split's meta, so evaluation reads it with the data."""
    a, b = getattr(dataset, "propensity", DEFAULT_PROPENSITY)
    return float(a), float(b)


def featurizer_accepts(featurizer: Any) -> Any:
    """The modalities a featurizer (class or instance) declares it takes, as declared."""
    return getattr(featurizer, "accepts", ("dense",))


def featurizer_output(featurizer: Any) -> Any:
    """The kind of features a featurizer (class or instance) declares it returns."""
    return getattr(featurizer, "output", "dense")


def batch_modes(loss: Any) -> tuple[str, ...]:
    """The modes a loss (class or instance) takes, read from the batch type its ``forward``
    annotates: ``FullBatch``, ``SampledBatch`` or ``FullBatch | SampledBatch``. Empty when the
    annotation names neither (the registry refuses such a loss)."""
    from tailkit.components import BATCH_TYPES

    cls = loss if isinstance(loss, type) else type(loss)
    forward = getattr(cls, "forward", None)
    if forward is None:
        return ()
    try:
        hint = typing.get_type_hints(forward).get("batch")
    except (NameError, TypeError):
        return ()
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    arms = typing.get_args(hint) if union else (hint,)
    return tuple(mode for mode, kind in BATCH_TYPES.items() if kind in arms)


def model_input_kind(model: Any) -> str:
    """The feature kind a model (class or instance) reads; dense when it declares none."""
    return getattr(model, "input_kind", "dense")


def is_learner(model: Any) -> bool:
    """Whether a model (class or instance) trains itself (:class:`Learner`)."""
    from tailkit.components import Learner

    cls = model if isinstance(model, type) else type(model)
    return issubclass(cls, Learner)


def _returned_class(factory: Any) -> type | None:
    """The class a factory builds: itself when it is one, else its return annotation's class
    (None when it declares none)."""
    if isinstance(factory, type):
        return factory
    try:
        returned = typing.get_type_hints(factory).get("return")
    except (NameError, TypeError):
        return None
    return returned if isinstance(returned, type) else None
