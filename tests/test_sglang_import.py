"""kvtier never imports SGLang unless asked to, and asking without SGLang says what to do.

The backend itself is tested against the real package in tests/sglang (its own
environment: scripts/install_sglang_test_env.sh).
"""

import subprocess
import sys

import pytest


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)


def test_kvtier_and_its_integrations_load_no_sglang() -> None:
    code = ("import sys, kvtier, kvtier.integrations, kvtier.tiers.pages; "
            "sys.exit('sglang' in sys.modules)")
    assert _run(code).returncode == 0


def test_the_check_can_fail() -> None:
    """Negative control: a module that does import something is seen importing it."""
    assert _run("import sys, kvtier.tiers.pages; sys.exit('kvtier.tiers.build' in "
                "sys.modules)").returncode == 1


def test_importing_the_backend_without_sglang_says_what_to_install() -> None:
    if _run("import sglang.srt").returncode == 0:  # in a child: tests/sglang is on our path
        pytest.skip("SGLang is installed here (tests/sglang cover the backend)")
    out = _run("import kvtier.integrations.sglang")
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: kvtier.integrations.sglang needs SGLang")
    assert "scripts/install_sglang_test_env.sh" in last and "sglang==0.5.23" in last
