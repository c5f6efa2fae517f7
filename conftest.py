# Makes `pytest scenarios/` a regression suite: the dmpcheck plugin collects every scenario
# file as a test module and every matrix cell as an item.  The module is found in
# $DMPCHECK_BUILD_DIR (default build/) under harness/python.
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "harness", "python"))
pytest_plugins = ["pytest_dmpcheck"]
