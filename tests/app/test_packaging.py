"""What pip reads: the distribution's name, its license, the command it installs, the pins on the five libraries
whose private APIs compat/ uses, the type-hint marker of every package, and the install command errors print."""

from __future__ import annotations

import os
import re
import tomllib
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import compat.extras
from tests.app.test_compat import COMPAT_MODULES
from tests.helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = ("app", "modules", "datamodules", "envs", "checkpoints", "callbacks", "export", "compat")


def requirements() -> dict[str, Requirement]:
    return {Requirement(line).name: Requirement(line) for line in PROJECT["dependencies"]}


@pytest.mark.parametrize("module", COMPAT_MODULES, ids=lambda module: module.DISTRIBUTION)
def test_each_pin_admits_exactly_the_minor_version_compat_was_written_against(module):
    """compat/ holds for one minor version of each library (any patch), and tests/app/test_compat.py fails on another:
    the requirement pip resolves says the same, so that an install never picks a version the tests refuse."""
    pin = requirements()[module.DISTRIBUTION].specifier
    written = Version(module.WRITTEN_AGAINST)
    major, minor = written.major, written.minor
    assert written in pin and Version(f"{major}.{minor}.0") in pin and Version(f"{major}.{minor}.99") in pin
    assert Version(f"{major}.{minor + 1}.0") not in pin
    assert minor == 0 or Version(f"{major}.{minor - 1}.99") not in pin
    assert version(module.DISTRIBUTION) in pin  # what this machine runs


def test_the_distribution_name_license_and_command():
    assert PROJECT["name"] == compat.extras.DISTRIBUTION != "lightrl"  # "lightrl" on the index is another project
    assert PROJECT["license"] == "MIT" and PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    assert PROJECT["scripts"] == {"lightrl": "app.__main__:main"}
    extras = PROJECT["optional-dependencies"]
    for extra, needs in extras.items():  # the extras that name others name this distribution
        for line in needs:
            requirement = Requirement(line)
            if requirement.name.startswith("lightrl"):
                assert requirement.name == PROJECT["name"] and requirement.extras <= set(extras), (extra, line)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_ships_its_type_hints(package):
    assert (ROOT / package / "py.typed").is_file()
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert f"{package}*" in found["include"]


def test_the_install_command_names_this_projects_extra(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert compat.extras.install_command("video") == 'pip install -e ".[video]"'
    monkeypatch.chdir(tmp_path)  # from elsewhere: the checkout's path relative to here
    assert compat.extras.install_command("gym") == f'pip install -e "{os.path.relpath(ROOT, tmp_path)}[gym]"'
    monkeypatch.setattr(compat.extras, "_CHECKOUT", tmp_path)  # installed from the index: no pyproject.toml there
    assert compat.extras.install_command("tune") == 'pip install "lightrl-train[tune]"'


def test_no_install_hint_names_another_distribution():
    """Every install hint in the code goes through compat.extras (a hint naming ``"lightrl[...]"`` would fetch the
    unrelated project of that name)."""
    hint = re.compile(r"pip install [\"']?lightrl\b(?!-train)")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in (*PACKAGES, "tests", "benchmarks", "configs")
        for path in sorted((ROOT / folder).rglob("*.py")) + sorted((ROOT / folder).rglob("*.yaml"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if hint.search(line)
    ]
    assert offenders == []
