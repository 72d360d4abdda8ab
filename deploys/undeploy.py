"""Undeploy: every unit ironserve put on a host for serving is stopped, disabled and its files removed.

`pyinfra INVENTORY deploys/undeploy.py`: the units of ironserve's naming (roles/undeclared.py) go, with their env
files, staged copies, parse markers and last good configurations; the driver and runtime stack, the venvs and the
weights stay. Idempotent: a second run changes nothing.
"""

from roles import undeclared

undeclared.undeclared_removed(name="Undeploy: every unit of ironserve's naming stopped, disabled, removed", declared=[])
