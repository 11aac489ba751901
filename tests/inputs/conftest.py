"""The folder of models the command tests name (tests/cli/conftest.py), for the ``.pt2`` readers' tests."""

from tests.cli.conftest import workdir  # noqa: F401
