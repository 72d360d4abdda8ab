"""What the roles put on a host, as data for the audit: files with their content hash, packages, runtime state.

Each role of the deploy's registry (roles/deployment.py ``PREPARE_ROLES``) says what it puts on a host
(``Role.desired_files`` / ``desired_packages`` / ``desired_runtime``, roles/desired.py's types), built from the same
functions its operations use; this module collects them from the roles the deploy runs on the host, so the audit
compares exactly what the deploy writes.
"""

from __future__ import annotations

from roles.desired import DesiredFile, DesiredPackage, RuntimeCheck


def role_files(ctx) -> list[DesiredFile]:
    from roles.deployment import roles_for

    return [item for role in roles_for(ctx) for item in role.desired_files(ctx)]


def role_packages(ctx) -> list[DesiredPackage]:
    from roles.deployment import roles_for

    return [item for role in roles_for(ctx) for item in role.desired_packages(ctx)]


def runtime_checks(ctx) -> list[RuntimeCheck]:
    """Image digests present and used, venv package versions, driver state."""
    from roles.deployment import roles_for

    return [item for role in roles_for(ctx) for item in role.desired_runtime(ctx)]
