"""Hardware catalog: one TOML file per GPU, shipped as package data.

Every figure in a file carries its source in the file's ``[sources]`` table. ``planner.model.catalog``
loads and validates these files; this package only holds the data.
"""
