"""The tools users of this field pick instead, as models in tailkit's table: napkinXC's PLT and
omikuji's Parabel-like forest (``pip install 'tailkit[peers]'``). Each trains itself
(:class:`~tailkit.components.Learner`) inside ``train@<experiment>`` on the pipeline's split and
features and is scored by the same ``evaluate`` stage. Without the tools installed both are
still listed, as unavailable with the install command; naming one is then a one-line error."""

from tailkit.hookspecs import hookimpl


@hookimpl
def register_models(register):
    from tailkit.plugins.peers.napkinxc_plt import NapkinXCPLT
    from tailkit.plugins.peers.omikuji_forest import Omikuji
    from tailkit.plugins.peers.tooling import INSTALL, available

    for name, factory, module in (
        ("napkinxc-plt", NapkinXCPLT, "napkinxc"),
        ("omikuji", Omikuji, "omikuji"),
    ):
        description = factory.__doc__.splitlines()[0]
        if not available(module):
            description = f"(unavailable: {INSTALL}) {description}"
        register(name, factory, description)
