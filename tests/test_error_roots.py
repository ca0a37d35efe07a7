"""Every error class of the NAC, ARK and IR v2 packages derives from its area's root (`nac_lab.errors`), so that one `except` catches
whatever an area refused. The exceptions are listed with the reason."""
import importlib, inspect, pkgutil
import pytest
from nac_lab.errors import NacLabError, NacError, ArkError, Irv2Error

ROOTS = {'nac': NacError, 'ark': ArkError, 'irv2': Irv2Error}
#: shared by several areas although defined in nac/: the one memory-budget error (NEM, ARK and IR v2 raise it too)
SHARED = {'nac_lab.guard.MemoryLimitError'}

def _errors(pkg: str) -> list:
    out = []
    base = importlib.import_module(f'nac_lab.{pkg}')
    for info in pkgutil.walk_packages(base.__path__, prefix=f'nac_lab.{pkg}.'):      # the stage subpackages too
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and issubclass(obj, NacLabError) and obj.__module__ == mod.__name__:
                out.append(obj)
    return out

@pytest.mark.parametrize('pkg', sorted(ROOTS))
def test_every_area_error_has_the_area_root(pkg):
    errs = _errors(pkg)
    assert len(errs) >= 4, errs              # the walk found the area's classes
    wrong = [f'{e.__module__}.{e.__qualname__}' for e in errs
             if not issubclass(e, ROOTS[pkg]) and f'{e.__module__}.{e.__qualname__}' not in SHARED]
    assert wrong == []

def test_roots_are_distinct():
    from nac_lab.nac.compiler.optimize import NacCompileError
    from nac_lab.ark.format import ArkFormatError
    from nac_lab.irv2.gguf import GGUFError
    from nac_lab.binio import BadValueError
    assert issubclass(NacCompileError, NacError) and not issubclass(NacCompileError, (ArkError, Irv2Error))
    assert issubclass(ArkFormatError, ArkError) and issubclass(ArkFormatError, BadValueError)      # still a located format error
    assert issubclass(GGUFError, Irv2Error) and not issubclass(GGUFError, NacError)

def test_error_classes_are_imported_from_errors():
    "Every module takes error classes from their home, `nac_lab.errors`, not from `binio` (which only re-exports them)."
    import ast
    from pathlib import Path
    import nac_lab, nac_lab.errors as errors_mod
    names = {n for n, o in vars(errors_mod).items() if inspect.isclass(o) and issubclass(o, BaseException)}
    root, bad = Path(nac_lab.__file__).parent, []
    for f in sorted(root.rglob('*.py')):
        if f.name in ('binio.py', '_modidx.py'): continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[-1] == 'binio':
                bad += [f'{f.relative_to(root)}:{node.lineno} {a.name}' for a in node.names if a.name in names]
    assert len(names) >= 10 and bad == []
