import os

import pytest

from r2ac.environ import environ


def test_environ_sets_inside_and_restores_values_and_absence(monkeypatch):
    monkeypatch.setenv("R2AC_TEST_KEPT", "old")
    monkeypatch.delenv("R2AC_TEST_NEW", raising=False)
    with pytest.raises(RuntimeError):
        with environ(R2AC_TEST_KEPT="new", R2AC_TEST_NEW="1"):
            assert os.environ["R2AC_TEST_KEPT"] == "new" and os.environ["R2AC_TEST_NEW"] == "1"
            raise RuntimeError  # restored on the way out of an error too
    assert os.environ["R2AC_TEST_KEPT"] == "old" and "R2AC_TEST_NEW" not in os.environ
