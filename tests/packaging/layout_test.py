"""The package's layout (#53): `keras_attention/layers/` lists layers (their
machinery lives in `layers/machinery`, the converters in `interchange`), and
no module imports one that imports it back, at module or function level."""

import ast
import importlib
import inspect
import pathlib

import keras

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "keras_attention"


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, name, modules):
    """The package's modules `path` imports anywhere in its code (a parent
    package's `__init__` is not counted: importing a child runs it anyway)."""
    found = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(
            t for t in targets if t in modules and t != name and not name.startswith(t + ".")
        )
    return found


def import_circles():
    """Each set of modules that import each other round a circle (Tarjan)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, name, paths) for name, path in paths.items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return circles


def test_no_module_imports_one_that_imports_it_back():
    assert import_circles() == []


def test_the_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    # The check above can fail: two modules importing each other inside
    # functions are found.
    package = tmp_path / "keras_attention"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from keras_attention import b\n")
    (package / "b.py").write_text("from keras_attention.a import f\n")
    monkeypatch.setitem(globals(), "PACKAGE", package)
    assert import_circles() == [["keras_attention.a", "keras_attention.b"]]


def test_the_layers_folder_lists_layers():
    for path in sorted((PACKAGE / "layers").glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = importlib.import_module(_module_name(path))
        layers = [
            value
            for value in vars(module).values()
            if inspect.isclass(value)
            and issubclass(value, keras.layers.Layer)
            and value.__module__ == module.__name__
        ]
        assert layers, f"{path.name} defines no layer: machinery goes to layers/machinery"
