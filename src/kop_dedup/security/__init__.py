"""Roles and permissions: who a token is (identity), what it may do (authorizer),
who owns a transactional id or a group (owners). See docs/operations/security.md."""
