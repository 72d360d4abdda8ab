"""What deploys/*.py call: every host's converged check sent, then the deployment loaded and planned.

    from roles.entry import deploy_model

    deploy_model("glm5")

Importing this module loads pyinfra and gevent only; the host data's model loads to see that every host has the
fast path on. The roles, the catalogue and the deployment's context load after the fast path's check is on its way
to every host (roles/converged_check.py), so the hosts read while the controller loads. roles.deployment.deploy_model, which a deploy written before this calls, plans the same, with
the check sent once the roles are loaded.
"""

from __future__ import annotations

from roles import converged_check


def deploy_model(model: str):
    """roles.deployment.deploy_model(model), the converged check sent first."""
    converged_check.start()
    from roles.deployment import deploy_model as planned

    return planned(model)
