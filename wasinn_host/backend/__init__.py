"""Backends behind the front ends: the protocol, the local registry and engine, and a fake for tests."""
