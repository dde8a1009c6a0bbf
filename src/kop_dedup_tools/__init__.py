"""Developer and operator tools for kop-dedup: the local Pulsar launcher, the load driver
and the benchmark. The service never imports this package; the ``kop-dedup`` CLI loads
each tool lazily for its subcommand.

Each command's module (``launcher``, ``kafka_broker``, ``load``, ``bench``,
``registry_startup``) holds its options and exports the names callers use; the work is
in modules of one concept each, and imports flow from the command down, never back:

- ``launcher`` (``kop-dedup pulsar``): ``processes`` (a server as its own process
  group, ``free_port``), ``distribution`` (a Maven distribution unpacked once);
- ``kafka_broker`` (``kop-dedup kafka``, the reference Apache Kafka broker):
  ``kafka_jars`` (Kafka's broker and tools jars from Maven Central, ``java`` command
  lines), on ``processes`` and ``distribution``'s file lock;
- ``load``: ``load_types``, ``load_driver``, ``load_background``, ``load_verify``;
- ``bench`` (a package): ``bench.command`` (options, the mode chosen, the broker), a
  module per mode (``produce``, ``memory``, ``txn``, ``groups``, ``kafka``,
  ``kafka_groups``), and the one shape of their results every mode shares:
  ``bench.cells`` (cells, rows, the aggregation), ``bench.results`` (the JSON file),
  ``bench.table`` (markdown) and ``bench.plot`` (a PNG);
- shared by all: ``sidecar`` (a ``kop-dedup serve`` subprocess), ``topics``,
  ``measure``.
"""
