"""What pyproject.toml declares is what CI proves: `make test-lowest` installs .ci/lowest.txt, one pin per declared
floor, so the two must name the same versions."""

from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers import REPO


def declared_floors() -> dict[str, Version]:
    """Each dependency of the installed project (extras included) and the version its `>=` names."""
    floors = {}
    for line in requires("lightning-ddp-mnist"):
        requirement = Requirement(line)
        (floor,) = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        floors[canonicalize_name(requirement.name)] = Version(floor)
    return floors


def pinned() -> dict[str, Version]:
    lines = Path(REPO / ".ci" / "lowest.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    return {canonicalize_name(name): Version(version) for name, version in pins}


def test_the_lowest_versions_ci_installs_are_the_declared_floors():
    assert pinned() == declared_floors()
