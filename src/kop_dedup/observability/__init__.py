"""Stats, metrics and logs."""
