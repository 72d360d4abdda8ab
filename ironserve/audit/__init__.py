"""Drift audit: checks derived from the deployment's spec, run with pytest + testinfra."""

from .runner import add_audit_parser, audit  # noqa: F401
