"""`provenance.library_version` reads the same version `importlib.metadata.version` does, only faster."""
from importlib import metadata

from ctrlsim.experiments.provenance import library_version, software_versions


def test_every_installed_distribution_reads_the_same_version():
    names = sorted({dist.metadata["Name"] for dist in metadata.distributions()})
    assert len(names) > 10
    assert {name: library_version(name) for name in names} == {name: metadata.version(name) for name in names}


def test_a_missing_distribution_is_none_and_left_out_of_the_recorded_versions():
    assert library_version("surely-not-an-installed-distribution") is None
    versions = software_versions()
    assert versions["numpy"] == metadata.version("numpy")
    assert "surely-not-an-installed-distribution" not in versions
