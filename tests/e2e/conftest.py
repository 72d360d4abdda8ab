"""The lab end-to-end tests' collection: on a shared lab, a test of a hardware profile its hosts lack is deselected."""

from __future__ import annotations

from . import labcli


def pytest_collection_modifyitems(config, items):
    """A test marked ``lab_profile(P)`` on a shared lab (IRONSERVE_LAB_HOSTS, scripts/test's stages) whose named hosts
    have no host of P is deselected (counted, never skipped): scripts/test splits one module's tests between streams by
    the hosts it gives each. Off a shared lab every test stays (the module brings up what it needs)."""
    if not labcli.shared_hosts():
        return
    markers = {item: item.get_closest_marker("lab_profile") for item in items}
    if not any(markers.values()):
        return
    have = set(labcli.shared_profiles().values())
    dropped = [item for item, marker in markers.items() if marker and marker.args[0] not in have]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
