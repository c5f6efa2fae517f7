import os
import shutil
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BUILD = os.environ.get("DMPCHECK_BUILD_DIR", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(BUILD, "harness", "python"))
sys.path.insert(0, os.path.join(ROOT, "harness", "python"))

pytest_plugins = ["pytester"]


@pytest.fixture
def root():
    return ROOT


@pytest.fixture
def dmpcheck_bin():
    return os.environ.get("DMPCHECK_BIN", os.path.join(BUILD, "harness", "dmpcheck"))


@pytest.fixture
def seed(root):
    return os.path.join(root, "scenarios", "regressions", "torchrec-1739-dp-tables-not-broadcast.yaml")


@pytest.fixture
def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); ci/setup.sh installs it")
    return path
