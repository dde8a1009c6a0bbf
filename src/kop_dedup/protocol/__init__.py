"""Kafka's produce protocol as pure data and rules: records, sequence arithmetic, the
per-channel rules machine and epoch fencing. No I/O, no Pulsar, no asyncio."""
