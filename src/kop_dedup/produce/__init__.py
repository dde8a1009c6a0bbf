"""The produce path: channels (one Pulsar producer name on one partition topic) and the
thin service that runs a batch through the protocol rules to Pulsar and back."""
