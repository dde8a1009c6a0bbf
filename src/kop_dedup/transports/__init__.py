"""Transports: how clients reach the service. Nothing outside this package imports it."""
