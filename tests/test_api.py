"""The public API is pinned: a change to it is a deliberate change to this test.

Also the layering promises of DESIGN section 2: importing the contract loads nothing above
it, dependencies between the rooms point one way, no two kvtier modules import each other
(at module level, inside functions or for type checking alike), and no file is over 400
lines.
"""

import ast
import importlib
import json
import subprocess
import sys
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
UPPER = ("kvtier.planner", "kvtier.store", "kvtier.tiers", "kvtier.transfer", "kvtier.replay",
         "kvtier.integrations", "kvtier.engine", "kvtier.cli")
REPO = SRC.parent.parent
MAX_LINES = 400


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
    from kvtier.tiers.config import TierConfig
    from kvtier.tiers.tiered import TieredStore

    assert kvtier.coverage is coverage
    assert kvtier.TieredStore is TieredStore and kvtier.TierConfig is TierConfig
    assert kvtier.POLICIES is policies.POLICIES
    assert kvtier.make_policy("lru", 4).capacity == 4


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        kvtier.nope  # noqa: B018


@pytest.mark.parametrize("module", ["kvtier.coverage", "kvtier.retention", "kvtier.keys",
                                    "kvtier.namespace",
                                    "kvtier.layout"])
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


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """Every kvtier module ``path`` imports: at module level, inside functions, for type
    checking, absolute or relative."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m in modules}


def _import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        deps = _imports(path, name, set(files))
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


def test_no_import_cycles():
    graph = _import_graph()
    assert len(graph) > 50
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_graph_sees_imports_inside_functions_and_for_type_checking():
    graph = _import_graph()
    assert "kvtier.cli.explain" in graph["kvtier.cli.main"]  # inside _commands()
    assert "kvtier.tiers.records.seal" in graph["kvtier.tiers.records.format"]  # TYPE_CHECKING


# room -> the rooms it may import (DESIGN section 2): planner -> tiers -> store -> contract,
# the data plane beside the store
ROOMS_BELOW = {
    "kvtier.store": {"kvtier.store"},
    "kvtier.transfer": {"kvtier.transfer"},
    "kvtier.tiers": {"kvtier.tiers", "kvtier.store"},
    "kvtier.planner": {"kvtier.planner", "kvtier.store", "kvtier.tiers"},
}
CONTRACT = {"kvtier", "kvtier.layout", "kvtier.keys", "kvtier.namespace", "kvtier.coverage",
            "kvtier.retention",
            "kvtier.boundaries",
            "kvtier.buildinfo", "kvtier.presets", "kvtier.layoutfile"}


def _room(module: str) -> str:
    return ".".join(module.split(".")[:2])


@pytest.mark.parametrize("room", sorted(ROOMS_BELOW))
def test_dependencies_between_rooms_point_one_way(room):
    allowed = ROOMS_BELOW[room] | CONTRACT
    wrong = sorted(f"{name} -> {dep}" for name, deps in _import_graph().items()
                   if _room(name) == room for dep in deps if _room(dep) not in allowed)
    assert wrong == []


def _long_files() -> list[str]:
    files = [*SRC.rglob("*.py"), *(REPO / "benchmarks").glob("*.py")]
    return sorted(f"{p.relative_to(REPO)}: {n}" for p in files
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)


@pytest.mark.skipif(not (REPO / "benchmarks").is_dir(), reason="needs the source tree")
def test_no_file_is_over_400_lines():
    assert _long_files() == []


def test_the_cycle_check_can_fail():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_old_config_path_is_gone():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("kvtier.config")


def test_version_names_the_build():
    from kvtier import buildinfo

    out = subprocess.run([sys.executable, "-m", "kvtier", "--version"], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == f"kvtier {kvtier.__version__} ({buildinfo.describe()})"


def test_core_imports_without_torch():
    code = "import sys, kvtier, kvtier.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
