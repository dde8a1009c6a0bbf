"""Consumer groups: the durable offset store (shared with transactions), and later
membership, assignment and server-side resets."""
