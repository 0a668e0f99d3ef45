"""SGLang HiCache backend tests: run from the SGLang environment
(scripts/install_sglang_test_env.sh).

    .venv-sglang/bin/pytest -m sglang tests/sglang

Each module skips itself, with the reason, where SGLang is not installed. It checks for
``sglang.srt``, not ``sglang``: this folder itself would pass for a namespace package.
"""

import os

SGLANG_MISSING = ("needs SGLang 0.5.23: run scripts/install_sglang_test_env.sh, then "
                  ".venv-sglang/bin/pytest -m sglang tests/sglang")
# SGLang's fault injector reads these when a backend is built; only the test that turns
# them on may see them.
for _name in ("SGLANG_TEST_HICACHE_BACKEND_RANDOM_DELAY",
              "SGLANG_TEST_HICACHE_BACKEND_RANDOM_FAILURE"):
    os.environ.pop(_name, None)
