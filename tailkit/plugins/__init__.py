"""Built-in components, registered through the ``tailkit`` entry points like any plugin."""
