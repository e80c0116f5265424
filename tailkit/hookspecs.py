"""THE plugin contract of tailkit.

A plugin is a module (or object) with functions marked ``@tailkit.hookimpl`` whose names are
the hooks below, published under the entry-point group ``tailkit``::

    [project.entry-points.tailkit]
    my-plugin = "my_package.plugin"

Each ``register_*`` hook receives a ``register`` callback. Call it once per component::

    register(name, factory, description=None, aliases=())

``factory(**options)`` builds the component from its params.yaml mapping (minus ``name``);
its keyword arguments, their annotations and an optional ``constraints`` class attribute
declare and validate the options. Positional-only parameters are runtime inputs the core
passes. ``description`` defaults to the first line of the factory's docstring. A name (or
alias) registered twice, by any two plugins, is an error naming both. Built-in components are
registered through these same hooks and entry points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    import click

PROJECT = "tailkit"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class Register(Protocol):
    """The callback every ``register_*`` hook receives."""

    def __call__(
        self,
        name: str,
        factory: Callable[..., object],
        description: str | None = None,
        aliases: Sequence[str] = (),
    ) -> None: ...


# --- data ---------------------------------------------------------------------------------


@hookspec
def register_datasets(register: Register) -> None:
    """Register dataset factories.

    :param register: call ``register(name, factory)``; ``factory(**options)`` returns a
        :class:`tailkit.components.Dataset` (``fetch(dest)`` and ``load(raw_dir)``).
    """


@hookspec
def register_featurizers(register: Register) -> None:
    """Register featurizer factories.

    :param register: call ``register(name, factory)``; ``factory(**options)`` returns a
        :class:`tailkit.components.Featurizer` (``fit(inputs)``, ``transform(inputs)``).
    """


# --- sampling -----------------------------------------------------------------------------


@hookspec
def register_samplers(register: Register) -> None:
    """Register negative samplers.

    :param register: call ``register(name, factory)``; ``factory(**options)`` returns a
        :class:`tailkit.components.Sampler`: ``fit``, ``sample(x, y, m, generator)`` returning
        ids and log q, ``log_prob(x, labels)``, ``state_dict``/``load_state_dict``.
    """


# --- training -----------------------------------------------------------------------------


@hookspec
def register_losses(register: Register) -> None:
    """Register losses.

    :param register: call ``register(name, factory)``; ``factory(**options)`` returns a
        :class:`tailkit.components.Loss` whose ``mode`` is ``"full"`` or ``"sampled"`` and
        whose ``adjust_scores`` declares its prediction-time correction.
    """


@hookspec
def register_models(register: Register) -> None:
    """Register encoders Φ that feed the core's output layer.

    :param register: call ``register(name, factory)``; ``factory(in_dim, /, **options)``
        returns a :class:`tailkit.components.Encoder` with ``out_dim``.
    """


# --- command line -------------------------------------------------------------------------


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add click commands to the ``tailkit`` command group.

    :param cli: the root :class:`click.Group`; call ``cli.command()`` or ``cli.add_command``.
    """
