"""The package list, which pyproject.toml cannot state: every tvm_ops* package, found,
plus tvm_ops.specs and tvm_ops.schedules, the top-level folders pyproject maps in."""

from setuptools import find_packages, setup

setup(packages=find_packages(include=["tvm_ops*"]) + ["tvm_ops.specs", "tvm_ops.schedules"])
