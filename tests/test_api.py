"""The public API is pinned: a change to it is a deliberate change to this test.

Also the layering promises of DESIGN section 2: importing the contract loads nothing above
it, and no two kvtier modules import each other at module level.
"""

import ast
import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kvtier

PUBLIC = {
    "ChunkKey", "ChunkState", "ChunkStore", "Group", "HostSlab", "KeyChain", "Layout",
    "Lookup", "Namespace", "Outcome", "POLICIES", "PRESETS", "Planner", "RequestLimits",
    "StoreRefusal", "TierConfig", "TieredStore", "TransferJob", "__version__", "coverage",
    "load_layout", "make_policy", "preset", "with_eagle", "with_mtp",
}
SRC = Path(kvtier.__file__).resolve().parent
UPPER = ("kvtier.planner", "kvtier.store", "kvtier.transfer", "kvtier.replay",
         "kvtier.integrations", "kvtier.engine", "kvtier.cli")


def _loaded_after(statement: str) -> set[str]:
    code = f"import json, sys; {statement}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout
    return set(json.loads(out))


def test_all_is_pinned():
    assert set(kvtier.__all__) == PUBLIC
    for name in kvtier.__all__:
        assert hasattr(kvtier, name), name


def test_public_names_are_the_real_objects():
    from kvtier import coverage
    from kvtier.store import policies
    from kvtier.store.config import TierConfig
    from kvtier.store.tiered import TieredStore

    assert kvtier.coverage is coverage
    assert kvtier.TieredStore is TieredStore and kvtier.TierConfig is TierConfig
    assert kvtier.POLICIES is policies.POLICIES
    assert kvtier.make_policy("lru", 4).capacity == 4


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kvtier.nope  # noqa: B018


@pytest.mark.parametrize("module", ["kvtier.coverage", "kvtier.keys", "kvtier.layout"])
def test_the_contract_loads_nothing_above_it(module):
    loaded = _loaded_after(f"import {module}")
    assert module in loaded
    above = sorted(m for m in loaded if m.startswith(UPPER))
    assert above == [], f"importing {module} loaded {above}"
    assert "torch" not in loaded


def test_the_check_can_fail():
    """Negative control: importing the planner is seen loading the store."""
    loaded = _loaded_after("import kvtier.planner")
    assert "kvtier.store.results" in loaded


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """kvtier modules imported when ``path`` runs (not inside functions or TYPE_CHECKING)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        stmts = node.body if isinstance(node, (ast.Try, ast.If)) else [node]
        for stmt in stmts:
            if isinstance(stmt, ast.Import):
                found.update(a.name for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
                found.add(stmt.module)
                found.update(f"{stmt.module}.{a.name}" for a in stmt.names)
    return {m for m in found if m in modules}


def _import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        deps = _top_level_imports(path, set(files))
        # importing a.b.c first runs a and a.b; a module's own packages are already running
        graph[name] = {parent for d in deps for parent in _parents(d)} - {*_parents(name)}
    return graph


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts) + 1)]


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*path[path.index(dep):], dep] if dep in path else [node, dep]
            if dep not in state and (found := visit(dep, [*path, dep])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_no_module_level_import_cycles():
    graph = _import_graph()
    assert len(graph) > 50
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_check_can_fail():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_old_config_path_still_works_with_a_warning():
    sys.modules.pop("kvtier.config", None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from kvtier.config import TierConfig
    assert TierConfig is kvtier.TierConfig
    assert any(issubclass(w.category, DeprecationWarning) and "kvtier.store.config"
               in str(w.message) for w in caught)


def test_version_names_the_build():
    from kvtier import buildinfo

    out = subprocess.run([sys.executable, "-m", "kvtier", "--version"], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == f"kvtier {kvtier.__version__} ({buildinfo.describe()})"


def test_core_imports_without_torch():
    code = "import sys, kvtier, kvtier.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
