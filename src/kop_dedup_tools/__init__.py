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
- ``bench``: one module per mode, registered as a ``bench_support.BenchMode``
  (``bench_matrix``, ``bench_memory``, ``bench_txn``, ``bench_groups``), on the shared
  ``bench_support`` (failures, sidecars, progress), ``bench_produce`` (timed
  producers), ``bench_http`` (the HTTP client) and ``bench_report`` (aggregation, rows,
  plot backend, results file); each mode's results in its ``*_results`` module;
- shared by all: ``sidecar`` (a ``kop-dedup serve`` subprocess), ``topics``,
  ``measure``.
"""
