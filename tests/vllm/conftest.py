"""vLLM connector tests: run from the vLLM environment (scripts/install_vllm_test_env.sh).

    .venv-vllm/bin/pytest -m vllm tests/vllm

Each module skips itself, with the reason, where vLLM is not installed. It checks for
``vllm.config``, not ``vllm``: this folder itself would pass for a namespace package.
"""

VLLM_MISSING = ("needs vLLM 0.33: run scripts/install_vllm_test_env.sh, then "
                ".venv-vllm/bin/pytest -m vllm tests/vllm")
