"""The project is licensed Apache-2.0: the LICENSE file, the package metadata, the fixtures."""

from __future__ import annotations

from importlib.metadata import metadata

from kits.suitekit import ROOT


def test_licence_file_is_the_apache_license_2_0() -> None:
    """LICENSE holds the Apache License, Version 2.0, terms and appendix."""
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "APPENDIX: How to apply the Apache License to your work." in text


def test_package_metadata_declares_the_licence() -> None:
    """pyproject.toml and the installed metadata both say Apache-2.0 and ship LICENSE."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    assert 'license = "Apache-2.0"' in pyproject
    assert 'license-files = ["LICENSE"]' in pyproject
    installed = metadata("asgi-admission")
    assert installed["License-Expression"] == "Apache-2.0"
    assert installed.get_all("License-File") == ["LICENSE"]


def test_fixtures_keep_their_own_notices() -> None:
    """The captured cgroup trees keep their origins and licences beside them."""
    fixtures = ROOT / "tests" / "fixtures" / "cgroup"
    assert "Licences of the fixture files" in (fixtures / "LICENSES.md").read_text()
    assert (fixtures / "SOURCES.md").is_file()
