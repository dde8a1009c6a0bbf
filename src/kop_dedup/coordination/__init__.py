"""Coordinators: state kept in Pulsar with one writer per state partition (producer ids,
epochs, transactional ids; later transactions and consumer groups)."""
