"""The plugin contract: registration, provenance, duplicate and unknown names, broken plugins."""

from __future__ import annotations

import importlib.metadata
import types

import pytest
import torch

from tailkit import hookimpl, registry
from tailkit.components import FullBatch, Loss
from tailkit.errors import InvalidParameterError, PluginError, UnknownComponentError
from tailkit.registry import KINDS, make_registry


class Focal(Loss):
    """A stand-in loss."""

    def __init__(self, *, gamma: float = 2.0) -> None:
        super().__init__()
        self.gamma = gamma

    def forward(self, batch: FullBatch) -> torch.Tensor:
        return batch.logits.sum()


class Untyped(Loss):
    """A loss whose forward names no batch type."""

    def forward(self, batch) -> torch.Tensor:
        return batch.logits.sum()


def _plugin(name="focal", factory=Focal):
    mod = types.SimpleNamespace()

    @hookimpl
    def register_losses(register):
        register(name, factory)

    mod.register_losses = register_losses
    return mod


def test_builtins_register_through_entry_points():
    reg = make_registry()
    assert {"softmax", "sampled-softmax", "negative-sampling"} <= set(reg.names("losses"))
    assert {"uniform", "unigram", "in-batch"} <= set(reg.names("samplers"))
    assert {"geonames", "synthetic"} <= set(reg.names("datasets"))
    assert {"identity", "rff"} <= set(reg.names("featurizers"))
    assert "linear" in reg.names("models")
    softmax = reg.get("losses", "softmax", "k")
    assert softmax.plugin == "tailkit.losses" and softmax.distribution == "tailkit"
    report = {p["name"]: p for p in reg.report()}
    assert "softmax" in report["tailkit.losses"]["registered"]["losses"]


def test_every_component_has_a_description():
    reg = make_registry()
    for kind in KINDS:
        for component in reg.components(kind):
            assert component.description, f"{kind} {component.name} has no docstring"


def test_duplicate_name_is_an_error_naming_both_plugins():
    with pytest.raises(PluginError) as info:
        make_registry(extra_plugins=[("acme-losses", _plugin("softmax"))])
    message = str(info.value)
    assert "'tailkit.losses'" in message and "'acme-losses'" in message
    assert "'softmax'" in message


def test_info_record_holds_modes_options_and_traits():
    """Each component's facts are read once, at registration, into its frozen record."""
    reg = make_registry(extra_plugins=[("acme", _plugin())])
    focal = reg.get("losses", "focal", "k")
    assert focal.modes == ("full",) and focal.traits["multilabel"] is False
    assert [(o.name, o.type, o.default) for o in focal.options] == [("gamma", "a number", "2.0")]
    assert reg.get("losses", "sampled-softmax", "k").modes == ("sampled",)
    tau = {o.name: o for o in reg.get("losses", "logit-adjusted", "k").options}["adjustment"]
    assert tau.type == "one of 'loss', 'posthoc'" and "LA loss" in tau.doc
    assert reg.get("samplers", "in-batch", "k").traits["uses_negatives"] is False
    assert reg.get("samplers", "tree", "k").traits["conditional"] is True
    assert reg.get("featurizers", "tfidf", "k").traits["output"] == "sparse"
    assert reg.get("models", "napkinxc-plt", "k").traits["learner"] is True
    with pytest.raises(TypeError):
        focal.traits["modes"] = ["sampled"]  # read-only
    assert hash(focal) == hash(reg.get("losses", "focal", "k"))  # usable in sets and caches
    info = focal.info()
    assert info["kind"] == "loss" and info["options"][0]["name"] == "gamma"


def test_a_loss_without_a_batch_type_is_refused_at_registration(capsys):
    reg = make_registry(extra_plugins=[("acme", _plugin("untyped", Untyped))])
    assert "untyped" not in reg.names("losses")
    err = capsys.readouterr().err
    assert "plugin 'acme'" in err and "loss 'untyped'" in err and "FullBatch" in err


def test_unknown_name_lists_available_names():
    reg = make_registry(extra_plugins=[("acme", _plugin())])
    with pytest.raises(UnknownComponentError) as info:
        reg.build("losses", {"name": "focl"}, "experiments.a.loss")
    message = str(info.value)
    assert message.startswith("experiments.a.loss.name: unknown loss 'focl'")
    assert "focal" in message and "softmax" in message


def test_build_validates_options():
    reg = make_registry(extra_plugins=[("acme", _plugin())])
    assert reg.build("losses", {"name": "focal", "gamma": 1}, "k").gamma == 1.0
    with pytest.raises(InvalidParameterError, match=r"k\.gama: .*unknown|unknown key 'gama'"):
        reg.build("losses", {"name": "focal", "gama": 1}, "k")
    with pytest.raises(InvalidParameterError, match=r"k\.gamma: got 'x'"):
        reg.build("losses", {"name": "focal", "gamma": "x"}, "k")


def test_a_plugin_that_fails_to_import_is_reported_and_others_load(monkeypatch, capsys):
    real = list(registry._entry_points("tailkit"))
    broken = importlib.metadata.EntryPoint(
        name="broken-plugin", value="tailkit_no_such_module", group="tailkit"
    )
    monkeypatch.setattr(registry, "_entry_points", lambda group: [*real, broken])
    reg = make_registry()
    assert "softmax" in reg.names("losses")
    assert "broken-plugin" in capsys.readouterr().err
    entry = {p["name"]: p for p in reg.report()}["broken-plugin"]
    assert "ModuleNotFoundError" in entry["error"]
    with pytest.raises(UnknownComponentError, match="failed to load: broken-plugin"):
        reg.get("losses", "nope", "k")


def test_misspelled_hook_is_caught_at_start_up():
    mod = types.SimpleNamespace()

    @hookimpl
    def register_loss(register):  # missing the final "es"
        pass

    mod.register_loss = register_loss
    with pytest.raises(PluginError, match="unknown hook"):
        make_registry(extra_plugins=[("typo", mod)])


def test_every_hook_is_documented_in_the_plugin_guide():
    from pathlib import Path

    guide = (Path(__file__).parents[1] / "docs" / "plugins.md").read_text()
    reg = make_registry()
    for name in (
        "register_datasets",
        "register_featurizers",
        "register_samplers",
        "register_losses",
        "register_models",
    ):
        assert hasattr(reg.pm.hook, name)
        assert f"{name}(register)" in guide
    assert "register_commands(cli)" in guide


def test_two_distributions_with_one_plugin_name_is_an_error(monkeypatch):
    class FakeDist:
        def __init__(self, name):
            self.name, self.version = name, "1.0"

    def fake(name, dist):
        ep = importlib.metadata.EntryPoint(
            name=name, value="tailkit.plugins.losses", group="tailkit"
        )
        return ep._for(FakeDist(dist)) if hasattr(ep, "_for") else ep

    eps = [fake("shared", "acme-one"), fake("shared", "acme-one"), fake("shared", "acme-two")]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: eps)
    with pytest.raises(PluginError, match="'acme-one' and 'acme-two'"):
        list(registry._entry_points("tailkit"))


def _entry_point_module(tmp_path, monkeypatch, name: str, source: str):
    """An importable module ``name`` and an entry point to it beside the real ones."""
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    real = list(registry._entry_points("tailkit"))
    ep = importlib.metadata.EntryPoint(name=name, value=name, group="tailkit")
    monkeypatch.setattr(registry, "_entry_points", lambda group: [*real, ep])


def test_a_plugin_that_calls_sys_exit_at_import_is_one_warning_not_a_silent_exit(
    tmp_path, monkeypatch, capsys
):
    _entry_point_module(tmp_path, monkeypatch, "exiting_plugin", "import sys\nsys.exit(0)\n")
    reg = make_registry()
    assert "softmax" in reg.names("losses")
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "exiting_plugin" in x)
    assert "entry point exiting_plugin = exiting_plugin" in line and "sys.exit" in line
    assert "SystemExit(0)" in {p["name"]: p for p in reg.report()}["exiting_plugin"]["error"]


RAISING = """
from tailkit import FullBatch, Loss, hookimpl

class Half(Loss):
    def forward(self, batch: FullBatch):
        return batch.logits.sum()

@hookimpl
def register_losses(register):
    register("half-registered", Half, description="x")
    raise RuntimeError("boom in register")
"""


@pytest.mark.parametrize("trace", [False, True])
def test_a_register_hook_that_raises_names_the_plugin_and_withdraws_its_components(
    tmp_path, monkeypatch, capsys, trace
):
    if trace:
        monkeypatch.setenv("TAILKIT_TRACE_PLUGINS", "1")
    _entry_point_module(tmp_path, monkeypatch, "raising_plugin", RAISING)
    reg = make_registry()
    assert "softmax" in reg.names("losses")
    assert "half-registered" not in reg.names("losses")  # nothing half-registered remains
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("Warning: plugin 'raising_plugin'"))
    assert "register_losses failed: RuntimeError: boom in register" in line
    assert "entry point raising_plugin = raising_plugin" in line
    assert ("Traceback (most recent call last)" in err) == trace
    assert ("calling register_losses of plugin 'raising_plugin'" in err) == trace
    with pytest.raises(UnknownComponentError, match="failed to load: raising_plugin"):
        reg.get("losses", "half-registered", "k")


class _OddDefault(Loss):
    """A loss whose option defaults YAML cannot spell."""

    def __init__(self, *, dtype: object = torch.float32, eps: float = float("nan")) -> None:
        super().__init__()

    def forward(self, batch: FullBatch) -> torch.Tensor:
        return batch.logits.sum()


def test_an_option_default_json_cannot_hold_still_registers():
    """The info record shows such a default by its repr instead of failing the plugin."""
    reg = make_registry(extra_plugins=[("odd", _plugin("odd", _OddDefault))])
    options = {o.name: o.default for o in reg.get("losses", "odd", "k").options}
    assert options == {"dtype": "torch.float32", "eps": "nan"}


def test_every_catalog_record_builds_back_the_component_it_describes():
    """The lazy registry's records (JSON, as the catalog keeps them) describe each built-in
    component as registration did, and import back to the very factory registered."""
    import json

    from tailkit.registry import Component, full_registry

    registry = full_registry()
    for kind in KINDS:
        for component in registry.components(kind):
            back = Component.from_info(json.loads(json.dumps(component.info())))
            assert back == component, component.name
            assert component.reference is not None, component.name
            assert back.factory is component.factory, component.name


def test_a_record_whose_module_fails_to_import_falls_back_to_the_full_registry():
    from tailkit.registry import Component, full_registry

    real = full_registry().get("losses", "softmax", "loss")
    info = {**real.info(), "reference": "no_such_module_anywhere:SoftmaxCE"}
    assert Component.from_info(info).factory is real.factory
    gone = {**real.info(), "name": "not-a-loss", "reference": None}
    with pytest.raises(UnknownComponentError, match="unknown loss 'not-a-loss'"):
        Component.from_info(gone).factory  # noqa: B018 -- the property imports
    broken = {**gone, "reference": "no_such_module_anywhere:Gone"}
    with pytest.raises(
        PluginError, match="loss 'not-a-loss': importing no_such_module_anywhere:Gone failed"
    ):
        Component.from_info(broken).factory  # noqa: B018


def test_the_registry_from_the_catalog_reports_what_the_full_one_does():
    from tailkit.catalog import load_catalog
    from tailkit.registry import Registry, full_registry

    catalog = load_catalog()
    lazy = Registry.from_catalog(catalog.plugins, catalog.components)
    assert lazy.report() == full_registry().report()
    for kind in KINDS:
        assert lazy.names(kind) == full_registry().names(kind)


def test_a_stage_imports_only_the_components_it_builds(tmp_path):
    """With the catalog cached, looking a component up imports nothing; building one imports
    its own module (and torch, for a loss); the other components stay unimported."""
    import os
    import subprocess
    import sys

    probe = (
        "import sys; from tailkit.registry import get_registry; r = get_registry(); "
        "c = r.get('losses', 'softmax', 'loss'); "
        "mods = lambda: ['torch' in sys.modules, 'tailkit.plugins.losses.softmax' in "
        "sys.modules, 'tailkit.plugins.losses.ldam' in sys.modules]; print(*mods()); "
        "r.build('losses', {'name': 'softmax'}, 'loss'); print(*mods())"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", probe], check=True, env=env, capture_output=True, text=True
        ).stdout.splitlines()
        for _ in range(2)
    ]
    assert runs[0][0] == "True True True"  # no catalog yet: every plugin imported
    assert runs[1] == ["False False False", "True True False"]


def _registry_of(module_name: str):
    """A registry of one plugin whose loss class says it lives in ``module_name``."""

    class Outside(Loss):
        def forward(self, batch: FullBatch) -> torch.Tensor:
            return batch.logits.sum()

    Outside.__module__ = module_name
    plugin = types.ModuleType("outside_plugin")

    @hookimpl
    def register_losses(register):
        register("outside", Outside)

    plugin.register_losses = register_losses
    return make_registry(load_entrypoints=False, extra_plugins=[("outside", plugin)])


@pytest.mark.parametrize(
    ("module", "cached"),
    [("tailkit.somewhere", True), ("mymod", True), ("mymod.inner", True), ("elsewhere.mod", False)],
)
def test_a_catalog_is_cached_only_when_its_key_follows_every_components_code(
    monkeypatch, module, cached
):
    """The key follows the files of tailkit and of the entry points' packages (here one
    plugin, the single module ``mymod``); a component defined in another package could move
    without the key seeing it, so such a catalog is rebuilt on every run rather than kept with
    a stale record of where the code is."""
    from tailkit import catalog

    point = importlib.metadata.EntryPoint(name="mine", value="mymod", group="tailkit")
    monkeypatch.setattr(registry, "full_registry", lambda: _registry_of(module))
    monkeypatch.setattr(registry, "_entry_points", lambda group: iter([point]))
    built, clean = catalog._from_registry()
    assert [c["origin"] for c in built.components] == [f"{module}:_registry_of.<locals>.Outside"]
    assert clean is cached
