"""python -m dmpcheck_torchrec.probe OUT_JSON: can this interpreter run TorchRec cells?

Imports torch, fbgemm_gpu and torchrec (and TorchRec's distributed package, which the rank program
needs) in that order and writes a contract.ProbeAnswer to OUT_JSON: the versions the imports report
and where torchrec came from.  When an import fails it says which, with Python's error, and exits 1:
dmpcheck shows those lines to the user of `system: python:/path/to/bin/python`.
"""

from __future__ import annotations

import platform
import sys
from typing import List


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m dmpcheck_torchrec.probe OUT_JSON", file=sys.stderr)
        return 2
    for name in ("torch", "fbgemm_gpu", "torchrec", "torchrec.distributed"):
        try:
            __import__(name)
        except Exception as e:  # noqa: BLE001 -- any failure to import is the answer
            print(f"import {name} failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
    from dmpcheck_torchrec import contract, runner

    contract.save(contract.ProbeAnswer(versions=runner.versions(), python=platform.python_version()), argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
