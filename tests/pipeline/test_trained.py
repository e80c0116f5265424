"""Restoring a trained encoder: the saved tensors without drawing initial weights first, and the
usual build-then-load for an encoder that cannot be built on the meta device."""

from __future__ import annotations

import types

import torch

from tailkit import Encoder, hookimpl
from tailkit.params import parse_params
from tailkit.pipeline.trained import _restored_encoder
from tailkit.registry import make_registry


class ScaledIdentity(Encoder):
    """Φ(x) = s·x with s a non-persistent buffer computed at construction (not in the state)."""

    def __init__(self, in_dim: int, /) -> None:
        super().__init__()
        self.out_dim = in_dim
        self.register_buffer("scale", torch.full((in_dim,), 2.0), persistent=False)
        self.bias = torch.nn.Parameter(torch.zeros(in_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale + self.bias


class NeedsValues(Encoder):
    """An encoder whose construction reads a value (``.item()`` has no meta answer)."""

    def __init__(self, in_dim: int, /) -> None:
        super().__init__()
        self.out_dim = in_dim
        self.weight = torch.nn.Parameter(torch.randn(in_dim, in_dim))
        self.norm = float(self.weight.norm().item())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T / self.norm


def _plugin():
    mod = types.SimpleNamespace()

    @hookimpl
    def register_models(register):
        register("scaled-identity", ScaledIdentity)
        register("needs-values", NeedsValues)

    mod.register_models = register_models
    return mod


REGISTRY = make_registry(extra_plugins=[("test-trained", _plugin())])


def _params(model: dict):
    return parse_params(
        {
            "dataset": {"name": "synthetic"},
            "featurize": {"raw": {"name": "identity"}},
            "experiments": {
                "x": {
                    "loss": {"name": "softmax"},
                    "sampler": "none",
                    "features": "raw",
                    "model": model,
                },
            },
        },
        "test-params",
    )


def _saved_and_restored(model: dict, in_dim: int, seed: int) -> tuple[Encoder, Encoder, dict]:
    """A freshly built encoder, the one restored from a copy of its state, and that state;
    asserts the restore drew nothing (the global generator is where it was)."""
    params = _params(model)
    torch.manual_seed(seed)
    saved = REGISTRY.build("models", params.experiment("x").model, "model", in_dim)
    state = {k: v.clone() for k, v in saved.state_dict().items()}
    before = torch.get_rng_state()
    restored = _restored_encoder(params, REGISTRY, "x", in_dim, state)
    assert torch.equal(torch.get_rng_state(), before)
    return saved, restored, state


def test_the_restored_encoder_holds_the_saved_tensors_and_draws_nothing() -> None:
    saved, restored, state = _saved_and_restored({"name": "mlp", "hidden": [16], "dim": 8}, 5, 3)
    assert restored.state_dict().keys() == state.keys()
    for key, value in restored.state_dict().items():
        assert value.device.type == "cpu" and torch.equal(value, state[key])
    x = torch.randn(4, 5)
    assert torch.equal(restored(x), saved(x))
    assert all(p.requires_grad for p in restored.parameters())


def test_an_encoder_with_a_buffer_outside_its_state_is_built_and_loaded_as_usual() -> None:
    params = _params({"name": "scaled-identity"})
    state = {"bias": torch.arange(3, dtype=torch.float32)}
    restored = _restored_encoder(params, REGISTRY, "x", 3, state)
    assert not restored.scale.is_meta
    assert torch.equal(restored(torch.ones(1, 3)), torch.tensor([[2.0, 3.0, 4.0]]))


def test_an_encoder_that_needs_values_to_be_built_is_built_and_loaded_as_usual() -> None:
    params = _params({"name": "needs-values"})
    torch.manual_seed(0)
    saved = NeedsValues(4)
    state = {k: v.clone() for k, v in saved.state_dict().items()}
    restored = _restored_encoder(params, REGISTRY, "x", 4, state)
    assert torch.equal(restored.weight, saved.weight)
    assert not restored.weight.is_meta


def test_a_sparse_input_table_is_restored_without_its_normal_draws() -> None:
    # sparse-linear fills its table with normal_, which has no meta kernel of its own
    saved, restored, _ = _saved_and_restored({"name": "sparse-linear", "dim": 4}, 50, 1)
    assert torch.equal(restored.embed.weight, saved.embed.weight)
    assert restored.embed.sparse == saved.embed.sparse
