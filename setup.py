"""Only what pyproject.toml cannot say: the top-level ``resources/`` folder ships inside
the package as ``k3desk/resources`` (found with importlib.resources, see
k3desk/core/resources.py).  Everything else is configured in pyproject.toml."""

from setuptools import find_namespace_packages, setup

# data folders are namespace packages to setuptools; naming them keeps the build quiet
resource_packages = [
    "k3desk.resources",
    *(f"k3desk.resources.{p}" for p in find_namespace_packages(where="resources")),
]

setup(
    packages=[*find_namespace_packages(include=["k3desk*"]), *resource_packages],
    package_dir={"k3desk.resources": "resources"},
    package_data={
        "k3desk": ["py.typed"],
        "k3desk.devtools.templates": ["*.jinja"],
        "k3desk.resources": ["**/*"],
    },
)
