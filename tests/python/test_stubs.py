"""The type stubs (conveyor/__init__.pyi) describe what the package exports:
every exported name, every public method and attribute of every class, every
enum member; and help() has docstrings for the main calls."""

import ast
import inspect
import os

import conveyor


def stub_tree():
    path = os.path.join(os.path.dirname(conveyor.__file__), "__init__.pyi")
    with open(path) as f:
        return ast.parse(f.read())


def stub_names(body):
    names = {}
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names[t.id] = node
    return names


def test_stub_names_every_export():
    top = stub_names(stub_tree().body)
    missing = [n for n in conveyor.__all__ + ["__version__"] if n not in top]
    assert not missing, "not in __init__.pyi: %s" % missing


def test_stub_classes_have_every_member():
    top = stub_names(stub_tree().body)
    gaps = []
    for name in conveyor.__all__:
        obj = getattr(conveyor, name)
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        members = stub_names(top[name].body)
        if hasattr(obj, "__members__"):  # enums: every member
            wanted = set(obj.__members__)
        else:
            wanted = {m for m in dir(obj) if not m.startswith("_")}
            wanted |= {m for m in ("__enter__", "__exit__", "__len__") if m in vars(obj)}
        gaps += ["%s.%s" % (name, m) for m in sorted(wanted - set(members))]
    assert not gaps, "not in __init__.pyi: %s" % gaps


def test_docstrings_for_help():
    for f in (conveyor.Device.open, conveyor.ProtectionDomain.register_memory, conveyor.CompletionQueue.wait,
              conveyor.QueuePair.post_send, conveyor.QueuePair.read_into, conveyor.connect,
              conveyor.Listener.accept, conveyor.CompletionQueue.wait_async):
        assert f.__doc__ and len(f.__doc__) > 20, f
    assert "registered object" in conveyor.MemoryRegion.__doc__
    assert conveyor.__doc__ and "import conveyor" in conveyor.__doc__


def test_signatures_name_python_types():
    # A class bound after a signature that names it shows up as its C++ name.
    leaks = []
    for name in conveyor.__all__:
        obj = getattr(conveyor, name)
        members = vars(obj).items() if inspect.isclass(obj) else [(name, obj)]
        for m, f in members:
            if not callable(f) or inspect.isclass(f):
                continue
            doc = getattr(f, "__doc__", None) or ""
            if "conveyor::" in doc or "std::" in doc:
                leaks.append("%s.%s" % (name, m))
    assert not leaks, "C++ type names in signatures: %s" % leaks
