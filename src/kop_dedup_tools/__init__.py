"""Developer and operator tools for kop-dedup: the local Pulsar launcher, the load driver
and the benchmark. The service never imports this package; the ``kop-dedup`` CLI loads
each tool lazily for its subcommand."""
