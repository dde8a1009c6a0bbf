"""The cluster of sidecars: membership decided by Pulsar, ownership computed alike on
every node (:mod:`.placement`), asked in one place (:mod:`.ownership`)."""
