"""One module per DVC stage; each exposes ``run(params, layout, registry)``."""
