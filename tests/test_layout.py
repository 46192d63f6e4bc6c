"""The package's layout: subpackages by concept, no import cycle, a lean import."""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

import asgi_admission

PACKAGE = Path(asgi_admission.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (TYPE_CHECKING too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolve against this module's package
                package = module_name(path).split(".")
                if path.name != "__init__.py":
                    package = package[:-1]
                base = ".".join([*package[: len(package) - node.level + 1], node.module])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in modules else base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & modules


def library_graph() -> dict[str, set[str]]:
    """Each library module's imports of other library modules; the package root, whose
    __init__ only re-exports, and the demo are left out."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {
        name: imports_of(path, modules) - {"asgi_admission", name}
        for name, path in paths.items()
        if name != "asgi_admission"
    }


def test_no_import_cycle() -> None:
    """No module reaches itself through the package's imports, TYPE_CHECKING ones included."""
    graph = library_graph()
    cycles: list[list[str]] = []

    def visit(name: str, stack: list[str]) -> None:
        for target in sorted(graph.get(name, ())):
            if target in stack:
                cycles.append([*stack[stack.index(target) :], target])
            elif target not in done:
                visit(target, [*stack, target])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        visit(name, [name])
    assert cycles == []


def test_the_library_never_imports_the_demo() -> None:
    """Only the demo itself imports asgi_admission.demo: the library stands without it."""
    importers = {
        name
        for name, targets in library_graph().items()
        if any(t == "asgi_admission.demo" or t.startswith("asgi_admission.demo.") for t in targets)
        and not name.startswith("asgi_admission.demo")
    }
    assert importers == set()


def test_admission_imports_nothing_of_the_asgi_side() -> None:
    """The service and its subpackages (``_admission``) import only the configuration (and its
    environment), the memory readings and the route names: the dependencies point one way, from the
    middleware to admission (docs/design.md)."""
    allowed = (
        "asgi_admission._admission",
        "asgi_admission._config",
        "asgi_admission._memory",
    )
    outside = {
        (name, target)
        for name, targets in library_graph().items()
        if name.startswith("asgi_admission._admission")
        for target in targets
        if not target.startswith(allowed) and target != "asgi_admission._routes"
    }
    assert outside == set()


def subpackages_defining() -> dict[str, set[str]]:
    """Each public name defined at the top of a module of ``_admission``, with the subpackages
    (``decision``, ``ledger``, ...; the service's own modules: ``_admission``) defining it."""
    admission = PACKAGE / "_admission"
    subpackages: dict[str, set[str]] = {}
    for path in admission.rglob("*.py"):
        parts = path.relative_to(admission).parts
        subpackage = parts[0] if len(parts) > 1 else "_admission"
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            else:
                names = []
            for name in names:
                if not name.startswith("_") and name not in ("logger", "T"):
                    subpackages.setdefault(name, set()).add(subpackage)
    return subpackages


def test_no_name_is_defined_in_two_subpackages() -> None:
    """A public name of ``_admission`` means one thing: no two subpackages define it (a module
    takes a shared name from the one that defines it)."""
    shared = {name for name, found in subpackages_defining().items() if len(found) > 1}
    assert shared == set()


def test_importing_the_package_loads_no_web_framework_or_demo() -> None:
    """`import asgi_admission` loads neither FastAPI, uvicorn nor the demo (in a fresh
    interpreter, so nothing this test run imported counts)."""
    code = (
        "import sys, asgi_admission\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'uvicorn') or m.startswith('asgi_admission.demo')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


#: Names with a leading underscore that are public API where they are found: the named
#: tuple's methods, and the interpreter's own ``sys._getframe`` and ``os._exit``.
PUBLIC_UNDERSCORED = frozenset({"_asdict", "_exit", "_fields", "_getframe", "_make", "_replace"})


def reaches_inside(tree: ast.Module) -> bool:
    """Whether a module imports a private module of the package, in any spelling, or
    reads or writes a private attribute of an object other than its own (``self``,
    ``cls``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [alias.name for alias in node.names] if module == "asgi_admission" else []
            if module.startswith("asgi_admission._") or any(
                name.startswith("_") and not name.startswith("__") for name in names
            ):
                return True
        elif (
            isinstance(node, ast.Import)
            and any(alias.name.startswith("asgi_admission._") for alias in node.names)
        ) or (isinstance(node, ast.Attribute) and someone_elses_private(node)):
            return True
    return False


def someone_elses_private(node: ast.Attribute) -> bool:
    """Whether ``node`` names a private attribute of an object other than ``self`` or
    ``cls``."""
    own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
    name = node.attr
    private = name.startswith("_") and not name.startswith("__")
    return private and name not in PUBLIC_UNDERSCORED and not own


def test_suite_modules_that_reach_inside_say_so() -> None:
    """A module of the suite (a test, a kit, an app it serves, a conftest) that imports a
    private module or reaches for another object's private attribute names the internal
    it is about (``INTERNAL = "..."``); everything else goes through the public API."""
    tests = Path(__file__).parent
    unmarked = []
    for path in sorted(tests.rglob("*.py")):
        tree = ast.parse(path.read_text())
        named = any(
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "INTERNAL" for t in node.targets)
            for node in tree.body
        )
        if reaches_inside(tree) and not named:
            unmarked.append(str(path.relative_to(tests)))
    assert unmarked == []


@pytest.mark.parametrize(
    ("source", "inside"),
    [
        ("from asgi_admission._admission.reservations import reservations", True),
        ("import asgi_admission._config", True),
        ("from asgi_admission import _config", True),
        ("def f():\n    from asgi_admission._config import AdmissionConfig", True),
        ("from asgi_admission import AdmissionConfig, __version__", False),
        ("import asgi_admission", False),
        ("from asgi_admission.demo import create_app", False),
        ("assert not watchdog._halt_tasks", True),
        ("guard.service._reservations = None", True),
        ("self._task = None\ncls._cache.clear()", False),
        ("point._replace(x=1)\ntype(app).__name__", False),
    ],
)
def test_every_spelling_of_a_private_import_is_seen(source: str, inside: bool) -> None:
    """The check above sees a private module imported in each spelling Python allows and
    another object's private attribute, and lets the public names (``__version__`` too),
    public subpackages, an object's own attributes and dunders pass."""
    assert reaches_inside(ast.parse(source)) is inside


def own_privates(tree: ast.Module) -> set[str]:
    """The private attributes the classes of a module define: assigned on ``self``,
    listed in ``__slots__`` or defined as methods."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            own.update(
                item.name
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                own.add(node.attr)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets
        ):
            own.update(
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return own


def foreign_privates(tree: ast.Module) -> set[str]:
    """The private attributes a module reads or writes on another object (not ``self``
    or ``cls``) that none of its own classes define, as written (``ticket._entry``)."""
    own = own_privates(tree)
    return {
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and someone_elses_private(node) and node.attr not in own
    }


#: Another module's private attributes that a module of the package touches on purpose:
#: asyncio's ``_get_running_loop`` (``None`` off a loop, where ``get_running_loop``
#: raises).
FOREIGN_PRIVATES = {
    "asgi_admission._admission.ledger.shared_ledger": {"asyncio._get_running_loop"},
    "asgi_admission._admission.scheduling.shared_order": {"asyncio._get_running_loop"},
    "asgi_admission._admission.scheduling.queue": {"asyncio._get_running_loop"},
}


def test_the_library_touches_no_other_modules_privates() -> None:
    """A private attribute is touched only in the module that defines it (by its class,
    or by a function beside it: a fork hook, a reservation's handle on its ledger): the
    service and the responders find a ticket's reservation through ``tickets.py``, the
    watchdog records in a session through its methods. Past the ones named above."""
    found = {
        module_name(path): names
        for path in sorted(PACKAGE.rglob("*.py"))
        if (names := foreign_privates(ast.parse(path.read_text())))
    }
    assert found == FOREIGN_PRIVATES


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("def run(ticket):\n    return ticket._entry", {"ticket._entry"}),
        ("def tick(session, sample):\n    session._last = sample", {"session._last"}),
        ("class T:\n    def __init__(self):\n        self._entry = 1\n"
         "def of(t):\n    return t._entry", set()),
        ("class T:\n    __slots__ = ('_x',)\ndef of(t):\n    return t._x", set()),
        ("class T:\n    def _forked(self): ...\ndef hook(t):\n    t._forked()", set()),
    ],
)  # fmt: skip
def test_another_modules_private_is_seen(source: str, found: set[str]) -> None:
    """The check above sees a private attribute read or written on another object, and
    lets one that a class of the same module defines pass."""
    assert foreign_privates(ast.parse(source)) == found


#: Names of a unit of memory, in any case and with or without a leading underscore.
UNIT_NAMES = frozenset({"kib", "mib", "gib", "kb", "mb", "gb"})


def units_defined(tree: ast.Module) -> list[str]:
    """The names of a unit of memory that a module binds by assignment, anywhere in it."""
    found = []
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        found += [
            t.id
            for t in targets
            if isinstance(t, ast.Name) and t.id.lower().lstrip("_") in UNIT_NAMES
        ]
    return found


def test_the_suite_and_benches_define_their_units_once() -> None:
    """The tests, their kits and the benches take ``MIB`` and ``GIB`` from
    ``kits.suitekit``: one set of constants, never a copy of one."""
    tests = Path(__file__).parent
    constants = tests / "kits" / "suitekit.py"
    assert constants.is_file()
    copies = {
        str(path.relative_to(tests.parent)): names
        for path in sorted([*tests.rglob("*.py"), *(tests.parent / "bench").rglob("*.py")])
        if path != constants and (names := units_defined(ast.parse(path.read_text())))
    }
    assert copies == {}


def v1_hierarchies_made(tree: ast.Module) -> int:
    """How many times a module builds ``Path("/sys/fs/cgroup/memory")`` itself."""
    return sum(
        isinstance(node, ast.Call) and ast.unparse(node).endswith("Path('/sys/fs/cgroup/memory')")
        for node in ast.walk(tree)
    )


def test_the_suite_and_benches_name_the_v1_hierarchy_once() -> None:
    """``V1_MEMORY`` of ``kits.suitekit`` is the one path to the cgroup v1 memory
    hierarchy, where real memory groups are made: no test, kit or bench builds its own."""
    tests = Path(__file__).parent
    constants = tests / "kits" / "suitekit.py"
    assert v1_hierarchies_made(ast.parse(constants.read_text())) == 1
    copies = [
        str(path.relative_to(tests.parent))
        for path in sorted([*tests.rglob("*.py"), *(tests.parent / "bench").rglob("*.py")])
        if path != constants and v1_hierarchies_made(ast.parse(path.read_text()))
    ]
    assert copies == []


@pytest.mark.parametrize(
    ("source", "made"),
    [
        ('V1 = Path("/sys/fs/cgroup/memory")', 1),
        ("def f() -> None:\n    group = pathlib.Path('/sys/fs/cgroup/memory') / 'g'", 1),
        ("from kits.suitekit import V1_MEMORY\ngroup = V1_MEMORY / 'g'", 0),
        ('print("needs a writable /sys/fs/cgroup/memory")', 0),
    ],
)
def test_a_v1_hierarchy_built_anywhere_is_seen(source: str, made: int) -> None:
    """The check above sees the path built at module level or in a function, through
    ``Path`` or ``pathlib.Path``, and not one imported or merely written in a message."""
    assert v1_hierarchies_made(ast.parse(source)) == made


def test_the_shared_kits_are_one_package() -> None:
    """The helpers the whole suite and the benches share are the modules of one package,
    ``tests/kits`` (``from kits.suitekit import MIB``): the top of tests/ holds only
    tests and the suite's conftest.py, and a helper one folder uses sits in that folder."""
    tests = Path(__file__).parent
    assert (tests / "kits" / "__init__.py").is_file()
    loose = [
        path.name
        for path in sorted(tests.glob("*.py"))
        if not path.name.startswith("test_") and path.name != "conftest.py"
    ]
    assert loose == []


def test_the_library_defines_its_units_once() -> None:
    """Each unit of memory is defined in one module of the package (``MIB`` in
    ``_config``), and the others take it from there; the demo, an app of the public API
    alone, keeps its own."""
    defined: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if not module_name(path).startswith("asgi_admission.demo"):
            for name in units_defined(ast.parse(path.read_text())):
                defined.setdefault(name.lower().lstrip("_"), []).append(module_name(path))
    assert defined["mib"] == ["asgi_admission._config"]
    assert {unit: modules for unit, modules in defined.items() if len(modules) > 1} == {}


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("MIB = 1024 * 1024", ["MIB"]),
        ("def f() -> None:\n    mib = 1024 * 1024", ["mib"]),
        ("_MiB: Final = 1 << 20", ["_MiB"]),
        ("from kits.suitekit import MIB\nsize = 4 * MIB", []),
    ],
)
def test_a_unit_defined_anywhere_is_seen(source: str, names: list[str]) -> None:
    """The check above sees a unit bound at module level or in a function, annotated or
    not, in any case, and not one imported."""
    assert units_defined(ast.parse(source)) == names


#: Words the code once used for things the glossary of docs/design.md names otherwise.
RETIRED_WORDS = re.compile(
    r"\b(keepers?|ReservationKeeper|KeeperParts|ProbeBoard|board|placeholders?|credit(?:s|ed|ing)?)\b",
    re.IGNORECASE,
)
#: Parts of names the package once used for things it now names plainly: settling's
#: floor (what is accounted for), mark (its last exact reading), credit (memory seen
#: freed) and placeholder (a record left early), and probing's gate (what the probes
#: answer for a route); each is retired as a plural too. As words, "floor" and "mark"
#: keep their plain sense (a reserve's floor), so only names are checked for them. A
#: "look" was a check of the latch (``LatchChecks.check_with_counts``, the stuck-pressure
#: watch's, the proxy's), a reading (the periodic sample's, the freed watch's) or the
#: search for other workers; ``lookup`` is a word of its own and stays. A replica's
#: "room" for more sessions is its capacity (``Capacity``, ``CapacityView``); as a word
#: it keeps its plain sense, and ``headroom`` is a word of its own.
RETIRED_NAME_PARTS = frozenset(
    {
        "floor",
        "mark",
        "credit",
        "credited",
        "placeholder",
        "gate",
        "look",
        "looked",
        "looking",
        "room",
    }
)
#: Parts of class names retired: a ``Hold`` is a waiter (``ProbeWaiter``); the verb
#: stays (``ticket.hold()``, ``hold_s``, ``..._holds_nothing``), so other names are
#: checked only for a ``holds`` at their end (the reservations' old waiters).
RETIRED_CLASS_PARTS = frozenset({"hold"})
#: Words the package's comments and docstrings no longer use (the docs' "quality gate"
#: is the test suite's, a plain sense).
RETIRED_PACKAGE_WORDS = re.compile(r"\b(gates?|gated)\b", re.IGNORECASE)
#: "A look" as a noun, in the package's comments and docstrings and in the docs (the
#: verb stays: "the reader looks", "looked up", "sessions that look larger").
RETIRED_NOUN = re.compile(
    r"\b(?:(?:a|an|one|the|its|each|next|last|two|periodic|own)\s+|'s\s+)looks?\b",
    re.IGNORECASE,
)
#: Names with a retired part in its plain sense: learning's noise floor, and the
#: benchmark's "floor" reference, the least any guard must do (bench/README.md); and a
#: public name kept for the users who call it, deprecated (``memory_room``).
PLAIN_NAMES = frozenset({"NOISE_FLOOR_BYTES", "Floor", "floor_app", "floor_added", "memory_room"})
#: Whole names retired: probing's window is a trial, and the count of each route's
#: observations kept is ``KEPT`` ("window" is learning's growth window alone).
RETIRED_WHOLE_NAMES = frozenset({"ProbeWindow", "MAX_WINDOWS", "WINDOW"})
#: Keywords retired, as arguments and keyword-only parameters: how many observations
#: are kept is ``keep=``. A ``window`` holding a learning window stays a plain name.
RETIRED_KEYWORDS = frozenset({"window"})


def name_parts(name: str) -> set[str]:
    """The words of a snake_case or CamelCase name, in lower case."""
    return {
        part.lower()
        for piece in name.split("_")
        for part in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+", piece)
    }


def retired_parts(parts: set[str], retired: frozenset[str]) -> set[str]:
    """The ``parts`` that are a ``retired`` word, singular or plural."""
    return {part for part in parts if part in retired or part.removesuffix("s") in retired}


def defined_names(tree: ast.AST) -> set[str]:
    """The names ``source`` defines: its functions, classes and arguments, the names it
    assigns and the attributes it assigns (``self.x = ...``); not the names it reads or
    calls (``math.floor(x)``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            found.add(node.attr)
    return found


def is_class_name(name: str) -> bool:
    """Whether ``name`` is CamelCase (``ProbeWaiter``), not a constant (``HOLD_S``)."""
    return name[:1].isupper() and not name.isupper()


def retired_names(tree: ast.AST) -> set[str]:
    """The names ``source`` defines made of a retired part."""
    return {
        name
        for name in defined_names(tree) - PLAIN_NAMES
        if name in RETIRED_WHOLE_NAMES
        or retired_parts(name_parts(name), RETIRED_NAME_PARTS)
        or re.search(r"(?:^|_)holds$", name)
        or (is_class_name(name) and retired_parts(name_parts(name), RETIRED_CLASS_PARTS))
    }


def prose_of(source: str, tree: ast.AST) -> str:
    """The comments and docstrings of ``source``, one a line: its prose, not its code."""
    comments = [
        token.string
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    docstrings = [
        node.value.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    ]
    return "\n".join([*comments, *docstrings])


def retired_keywords(tree: ast.AST) -> set[str]:
    """The retired keywords ``source`` passes or takes (keyword-only) by name."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in RETIRED_KEYWORDS:
            found.add(node.arg)
        elif isinstance(node, ast.arguments):
            found |= {arg.arg for arg in node.kwonlyargs} & RETIRED_KEYWORDS
    return found


def test_the_retired_words_are_gone() -> None:
    """Neither the docs nor the package's comments and docstrings use a word the glossary
    retired (the keeper is the reservations, the probe board the probes, settling's
    placeholder a record left early and its credit memory seen freed), nor does any code,
    tests and benchmarks too, define a name made of a retired part (a hold is a waiter,
    the probe gate what the probes answer, a probe window a trial, the learned
    observations kept ``KEPT``, a look a check, a reading or a search), nor pass or take
    ``window=`` (it is ``keep=``); and "a look" is no noun in the package's prose or the
    docs."""
    root = Path(__file__).parents[1]
    package = sorted(PACKAGE.rglob("*.py"))
    code = [
        *package,
        *sorted(root.joinpath("tests").rglob("*.py")),
        *sorted(root.joinpath("bench").rglob("*.py")),
    ]
    # Each file read and parsed once, for every check below.
    sources = {path: path.read_text() for path in code}
    trees = {path: ast.parse(source) for path, source in sources.items()}
    prose = {path: prose_of(sources[path], trees[path]) for path in package}
    found = {str(path): words for path in package if (words := RETIRED_WORDS.findall(prose[path]))}
    found |= {
        str(path): words
        for path in sorted(root.joinpath("docs").rglob("*.md"))
        if (words := RETIRED_WORDS.findall(path.read_text()))
    }
    assert found == {}
    named = {str(path): names for path in code if (names := retired_names(trees[path]))}
    assert named == {}
    worded = {
        str(path): words
        for path in package
        if (words := RETIRED_PACKAGE_WORDS.findall(prose[path]))
    }
    assert worded == {}
    nouns = {
        str(path): words
        for path, text in [
            *((path, prose[path]) for path in package),
            *((path, path.read_text()) for path in sorted(root.joinpath("docs").rglob("*.md"))),
        ]
        if (words := RETIRED_NOUN.findall(text))
    }
    assert nouns == {}
    keywords = {str(path): used for path in code if (used := retired_keywords(trees[path]))}
    assert keywords == {}


@pytest.mark.parametrize(
    ("source", "keywords"),
    [
        ("store = LearnedStore(directory, window=32)", {"window"}),
        ("def read_learned(directory: str, *, window: int) -> None: ...", {"window"}),
        ("store = LearnedStore(directory, keep=KEPT)", set()),
        ("for window in self._open:\n    window.alone = False", set()),
        ("def others_added(recent: list[int], window: OpenWindow) -> None: ...", set()),
    ],
)
def test_a_retired_keyword_is_seen(source: str, keywords: set[str]) -> None:
    """``window=`` passed or taken keyword-only is found; a positional ``window``, one
    of learning's windows, is not."""
    assert retired_keywords(ast.parse(source)) == keywords


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("floor, records = queue.load()", {"floor"}),
        ("self._sample_mark = settler.mark", {"_sample_mark"}),
        ("def make_placeholder(): ...", {"make_placeholder"}),
        ("class CreditPool: ...", {"CreditPool"}),
        ("def gate(self, route: str) -> Gate: ...", {"gate"}),
        ("def settle(*, floor: int, **credits: int) -> None: ...", {"floor", "credits"}),
        ("self._placeholders = 1", {"_placeholders"}),
        ("n_credits = 0", {"n_credits"}),
        ("marks = []", {"marks"}),
        ("holds = ProbeWaiters()", {"holds"}),
        ("def probe_gates(): ...", {"probe_gates"}),
        ("class Hold: ...", {"Hold"}),
        ("class HoldRegistry: ...", {"HoldRegistry"}),
        ("class ProbeWindow: ...", {"ProbeWindow"}),
        ("WINDOW = 32", {"WINDOW"}),
        ("self._probe_holds = {}", {"_probe_holds"}),
        ("def look(self) -> tuple[CapacityDecision, tuple[int, int]]: ...", {"look"}),
        ("LatchLook = Callable[[], int]\nLOOK_LIMIT = 4096", {"LatchLook", "LOOK_LIMIT"}),
        (
            "self._next_look = 0.0\nlooked = 1\nself._looking = None",
            {"_next_look", "looked", "_looking"},
        ),
        ("def test_a_look_that_fails(): ...\nlooks = 0", {"test_a_look_that_fails", "looks"}),
        ("def look_soon(self) -> None: ...", {"look_soon"}),
        ("if isinstance(outcome, Hold): ticket.hold()", set()),
        ("def hold(self, hold_s: float) -> None: ...", set()),
        ("HOLD_MB = 64\ndef test_a_ticket_holds_nothing(): ...", set()),
        ("self.windows: deque[Window] = deque(maxlen=KEPT)", set()),
        ("# the floor of a reserve\nx = 'a floor'", set()),
        ("accounted = marked + NOISE_FLOOR_BYTES", set()),
        ("rounded = math.floor(x)", set()),
        ("try:\n    pass\nexcept ProcessLookupError:\n    lookup = {}", set()),
        ("def lookups(): ...\nclass Lookup: ...", set()),
        ("class RoomView: ...\nrooms = [room_of(x)]", {"RoomView", "rooms"}),
        ("def wait_for_room(self, room: int) -> None: ...", {"wait_for_room", "room"}),
        ("container_headroom = 1\nHEADROOM_FRACTION = 0.1\nheadroomSessions = 2", set()),
        ("# room for a busy machine\nreason = 'no room'", set()),
    ],
)
def test_a_retired_name_is_seen(source: str, names: set[str]) -> None:
    """A name defined with a retired part, singular or plural, is found; the word in a
    comment or a string, inside a longer word, or in a name only read or called (a
    library's ``floor``), is not."""
    assert retired_names(ast.parse(source)) == names


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("# a placeholder of the pending\nx = 1", ["placeholder"]),
        ('def f() -> None:\n    """Its credits."""', ["credits"]),
        ("message = 'no placeholder here'", []),
        ("placeholder_count = 0", []),
    ],
)
def test_a_retired_word_is_seen_in_prose_only(source: str, words: list[str]) -> None:
    """The package's words are read from its comments and docstrings, not its strings
    or names (those the name check reads)."""
    assert RETIRED_WORDS.findall(prose_of(source, ast.parse(source))) == words


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("One look at the memory the guard protects.", ["One look"]),
        ("the waiter's look every 0.25 s finds it", ["'s look"]),
        ("at its next look; the periodic looks find it", ["next look", "periodic looks"]),
        ("the reader looks each request up, looked up once", []),
        ("sessions that look far larger; this looks like one", []),
        ("a lookup on the method", []),
    ],
)
def test_a_retired_noun_is_seen(text: str, words: list[str]) -> None:
    """ "A look" after an article, a possessive or "next"/"last"/"periodic" is found; the
    verb ("looks up", "sessions that look larger") and "lookup" are not."""
    assert [match.group(0) for match in RETIRED_NOUN.finditer(text)] == words


def test_the_glossary_holds_at_most_twelve_words() -> None:
    """docs/design.md opens with its words, at most twelve, each defined once."""
    text = (Path(__file__).parents[1] / "docs" / "design.md").read_text()
    table = text.split("## Words", 1)[1].split("\n## ", 1)[0]
    words = re.findall(r"^\| \*\*(\w+)\*\* \|", table, flags=re.MULTILINE)
    assert 0 < len(words) <= 12
    assert len(set(words)) == len(words)


def concept_of(path: Path) -> str:
    """What a module's docstring's first line names before its first colon: its concept."""
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    return docstring.split("\n", 1)[0].split(":", 1)[0]


def test_each_module_names_one_concept_in_its_first_line() -> None:
    """Every module of the package says in its first line which concept it holds, and
    names one: no "and" or ";" before the line's first colon (STYLE: if the sentence
    needs "and", it holds two)."""
    two = {
        module_name(path): concept
        for path in PACKAGE.rglob("*.py")
        if not (concept := concept_of(path)) or " and " in concept or ";" in concept
    }
    assert two == {}


@pytest.mark.parametrize(
    ("first_line", "one"),
    [
        ("Settling: a pending reservation lasts until its memory shows.", True),
        ("Learning what one session costs: its footprint and its ramp.", True),
        ("The readers and the writers: both.", False),
        ("What a refused client receives; the readiness answers.", False),
    ],
)
def test_a_module_naming_two_concepts_is_seen(first_line: str, one: bool, tmp_path: Path) -> None:
    """The check reads the part before the colon, where the concept is named."""
    module = tmp_path / "module.py"
    module.write_text(f'"""{first_line}"""\n')
    concept = concept_of(module)
    assert (" and " not in concept and ";" not in concept) is one


def named_files(text: str) -> list[str]:
    """The Python files a module's text names (``settling.py``, ``bench/churn.py``)."""
    return re.findall(r"(?<![\w./-])((?:[\w-]+/)*\w+\.py)\b", text)


def missing_files(text: str, root: Path) -> list[str]:
    """The files ``text`` names that are neither under ``root`` (the checkout) nor a
    module of the package, named by its file or its path below a subpackage."""
    package = [path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")]
    return [
        name
        for name in named_files(text)
        if not (root / name).exists()
        and not any(module == name or module.endswith("/" + name) for module in package)
    ]


def test_the_package_names_only_files_that_exist() -> None:
    """A note that names a module names one that is there: a file renamed or merged
    leaves no stale pointer behind (``_watching.run_http`` once named nothing)."""
    root = PACKAGE.parents[1]
    stale = {
        module_name(path): missing
        for path in PACKAGE.rglob("*.py")
        if (missing := missing_files(path.read_text(), root))
    }
    assert stale == {}


@pytest.mark.parametrize(
    ("text", "missing"),
    [
        ("see settling.py and decision/stuck.py", []),
        ("as bench/churn.py and tests/test_layout.py show", []),
        ("as the ledger beside it is (ledger_section.py)", ["ledger_section.py"]),
        ("the watch (``decision/stuck_watch.py``)", ["decision/stuck_watch.py"]),
    ],
)
def test_a_file_that_is_not_there_is_seen(text: str, missing: list[str]) -> None:
    assert missing_files(text, PACKAGE.parents[1]) == missing
