"""The test suite (a package, so that tests import shared helpers as `tests.helpers`)."""
