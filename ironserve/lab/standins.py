"""Stand-in hardware packages (placeholder, filled in next)."""
from pathlib import Path


def publish(root: Path) -> None:
    return None
