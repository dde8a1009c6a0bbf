"""The Pulsar adapter: the only package that imports ``pulsar``/``_pulsar`` and talks to
the admin API. ``naming`` and ``wire`` are pure (the Spark audit imports them), so this
``__init__`` imports nothing."""
