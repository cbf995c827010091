"""The documentation runs: every ```python block in docs/**/*.md is executed.

The blocks of one page run in order in one shared namespace (one test per page),
inside a fresh temporary working directory, so a page reads like a session a user
could type. Blocks fenced with any other info string (``python no-run``, ``console``,
``toml``, ...) are shown but not run. A failing block is reported with its page,
its line number and its code.

Content tabs (``=== "torch"`` followed by a block indented four spaces) show the same
step in several frameworks. The page runs with the first tab of every tab set; it runs
again with each later tab's label chosen (paddle, say: that tab's block in every tab set
that has one, the first tab's elsewhere), without comparing printed output, whose numbers
differ between frameworks. Tabs for frameworks the docs environment lacks (jittor,
oneflow) fence their code ``python no-run``; their own test suites run the page with them
(``run_page(..., tab="jittor")``).

Output a page shows is checked against what the code prints (see ``expected_output``):

- a ```` ```text ```` block that directly follows a ```` ```python ```` block (nothing but
  blank lines between) is that block's printed output;
- a line ``print(...)  # prints TEXT`` (the comment may go on over the next comment-only
  lines) prints TEXT.

In both, ``...`` stands for any text and runs of whitespace compare equal, so a page may
shorten long or machine-dependent output but never show output the code does not print.

Further tests keep the docs complete and navigable: every public name of
``drivetrain`` appears in the docs, every event appears on the callbacks page,
docs/index.md links to every page, and links between pages (and their #anchors)
resolve.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CALLBACKS_PAGE = DOCS / "user-guide" / "callbacks.md"

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_TAB_FENCE = re.compile(r"^(?P<indent> {4})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")  # a fence inside a content tab
_TAB = re.compile(r'^===[!+]? "(?P<label>[^"]*)"')


@dataclass
class Block:
    info: str
    line: int  # 1-based line number of the block's first code line
    code: str
    tab: str | None = None  # the label of the content tab holding the block
    later_tab: bool = False  # in a tab after the first of its tab set (run only when its label is chosen)
    tab_set: int = -1  # which tab set of the page holds it (-1: none)


def code_blocks(text: str) -> list[Block]:
    """Every fenced code block of a Markdown text, with its info string and first line number."""
    blocks: list[Block] = []
    lines = text.splitlines()
    tab, tab_index, tab_set = None, -1, -1  # the content tab the lines are in, its position in its set, the set
    i = 0
    while i < len(lines):
        tab_line = _TAB.match(lines[i])
        if tab_line is not None:
            tab_set += tab is None
            tab, tab_index = tab_line["label"], tab_index + 1
        elif lines[i].strip() and not lines[i].startswith(" "):
            tab, tab_index = None, -1  # unindented text ends a tab set
        match = _FENCE.match(lines[i]) or (_TAB_FENCE.match(lines[i]) if tab is not None else None)
        if match is None or (match["fence"][0] == "`" and "`" in match["info"]):
            i += 1
            continue
        fence, info, indent = match["fence"], match["info"].strip(), len(match["indent"])
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = lines[j].strip()
            if closing.startswith(fence[0] * len(fence)) and set(closing) == {fence[0]}:
                break
            line = lines[j]
            # Content of an indented fence loses up to that much indentation (CommonMark).
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            j += 1
        blocks.append(Block(info=info, line=i + 2, code="\n".join(body) + "\n", tab=tab, later_tab=tab_index > 0,
                            tab_set=tab_set if tab is not None else -1))
        i = j + 1
    return blocks


def blocks_to_run(text: str, tab: str | None = None) -> list[Block]:
    """The python blocks a page runs: outside tabs, and in each tab set the ``tab`` labelled one (else the first).

    ``tab=None`` takes the first tab of every set and only ```` ```python ```` blocks; a label also takes
    that tab's ``python no-run`` blocks (the fence for a framework the docs environment lacks).
    """
    blocks = code_blocks(text)
    labelled = {b.tab_set for b in blocks if tab is not None and b.tab == tab}
    chosen = []
    for b in blocks:
        if b.tab_set in labelled:
            if b.tab == tab and b.info in ("python", "python no-run"):
                chosen.append(b)
        elif b.info == "python" and not b.later_tab:
            chosen.append(b)
    return chosen


def later_tab_labels(text: str) -> list[str]:
    """Labels of the later tabs whose blocks the docs environment runs (``python``, not ``python no-run``)."""
    return sorted({b.tab for b in code_blocks(text) if b.later_tab and b.info == "python" and b.tab})


def pages_with_tab(label: str) -> list[Path]:
    """The pages with a content tab of this label (for a framework's own suite to run them with it)."""
    return [page for page in doc_pages() if any(b.tab == label for b in code_blocks(page.read_text(encoding="utf-8")))]


def expected_output(expected: str, printed: str) -> bool:
    """Whether ``printed`` is what a page shows as ``expected`` (``...`` = any text, whitespace runs equal)."""
    def norm(text: str) -> str:
        return " ".join(text.split())

    pattern = ".*?".join(re.escape(part.strip()) for part in norm(expected).split("..."))
    return re.fullmatch(pattern, norm(printed), flags=re.DOTALL) is not None


_PRINTS = re.compile(r"^(?P<indent>\s*)(?P<call>print\(.*\))\s+# prints(?: (?P<text>.*))?$")


def checked_prints(code: str, first_line: int) -> str:
    """``code`` with each ``print(...)  # prints TEXT`` line wrapped to check its output (line count kept)."""
    lines = code.split("\n")
    for i, line in enumerate(lines):
        match = _PRINTS.match(line)
        if match is None:
            continue
        text = [match["text"] or ""]
        for follow in lines[i + 1:]:
            stripped = follow.strip()
            if not stripped.startswith("#") or len(follow) - len(follow.lstrip()) < len(match["indent"]):
                break
            text.append(stripped[1:])
        lines[i] = (f"{match['indent']}with __docs_expect__({first_line + i}, {' '.join(text)!r}): "
                    f"{match['call']}")
    return "\n".join(lines)


class _Expect:
    """Context manager the ``# prints`` lines become: captures one print and compares it with the page."""

    def __init__(self, page: Path) -> None:
        self.page = page

    @contextlib.contextmanager
    def __call__(self, line: int, expected: str):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            yield
        sys.stdout.write(buffer.getvalue())
        assert expected_output(expected, buffer.getvalue()), (
            f"{_page_id(self.page)}:{line} shows '# prints {expected}', but the code printed:\n{buffer.getvalue()}")


def shown_outputs(text: str) -> dict[int, Block]:
    """``{line of a python block: the text block right after it}`` for the blocks a page shows the output of."""
    lines = text.splitlines()
    blocks = code_blocks(text)
    shown = {}
    for block, after in zip(blocks, blocks[1:], strict=False):
        closing = block.line - 1 + block.code.count("\n")  # 0-based index of the closing fence
        if block.info == "python" and after.info == "text" and not any(
                line.strip() for line in lines[closing + 1:after.line - 2]):
            shown[block.line] = after
    return shown


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _single_threaded() -> None:
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(1)
    if importlib.util.find_spec("paddle") is not None and "paddle" not in sys.modules:
        # paddle warns "No ccache found" on its first import on a machine without ccache (a compiler cache for
        # custom operators). Pages run with warnings as errors; a page that does not silence it would fail, and
        # its half-imported paddle would then break every later page. Import it once here, quietly.
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import paddle  # noqa: F401


@pytest.fixture
def clean_globals():
    """Undo what a page may leave in process-wide state: plugins registered in code, Trainer.on handlers."""
    from drivetrain import Trainer
    from drivetrain.backend._plugins import reset_registry

    saved = {marker: list(fns) for marker, fns in Trainer._registered_fns.items()}
    yield
    Trainer._registered_fns.clear()
    Trainer._registered_fns.update(saved)
    reset_registry()


class _NoExpect:
    """What ``# prints`` lines become when a page runs with another tab: the output is not compared."""

    @contextlib.contextmanager
    def __call__(self, line: int, expected: str):
        yield


def _lacks_a_package(exc: BaseException) -> bool:
    """Whether ``exc`` says an optional package is not installed (so the block cannot run in this env)."""
    from drivetrain import ConfigurationError

    return isinstance(exc, ModuleNotFoundError) or (
        isinstance(exc, ConfigurationError) and "not installed" in str(exc))


def run_page(page: Path, tab: str | None = None) -> None:
    """Run a page's python blocks in order in one namespace (``tab``: with that content tab chosen).

    With ``tab=None`` the output the page shows is compared with what its blocks print; with a tab
    label it is not (the numbers differ between frameworks), and a block that needs a package the
    framework's environment lacks (a logger's dependency, torch in oneflow's) is passed over; every
    other block must run.
    """
    text = page.read_text(encoding="utf-8")
    blocks = blocks_to_run(text, tab)
    shown = shown_outputs(text) if tab is None else {}
    if not blocks:
        pytest.skip(f"{_page_id(page)} has no ```python blocks")
    module_name = "docs_example_" + re.sub(r"\W", "_", _page_id(page))
    module = types.ModuleType(module_name)
    module.__file__ = str(page)
    module.__docs_expect__ = _Expect(page) if tab is None else _NoExpect()
    sys.modules[module_name] = module  # classes defined on the page get a real module (dataclasses, pickle)
    try:
        for block in blocks:
            # Pad with blank lines so tracebacks point at the page's own line numbers.
            code = compile("\n" * (block.line - 1) + checked_prints(block.code, block.line), str(page), "exec")
            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed) if block.line in shown else contextlib.nullcontext():
                    exec(code, module.__dict__)
                if block.line in shown:
                    sys.stdout.write(printed.getvalue())
                    output = shown[block.line]
                    assert expected_output(output.code, printed.getvalue()), (
                        f"the output shown at line {output.line} is not what the block printed:\n"
                        f"{printed.getvalue()}")
            except BaseException as exc:  # noqa: BLE001 - report any failure with its block
                if isinstance(exc, KeyboardInterrupt):
                    raise
                if tab is not None and _lacks_a_package(exc):
                    print(f"{_page_id(page)}:{block.line} passed over with the {tab!r} tabs: {exc}")
                    continue
                numbered = "\n".join(
                    f"{block.line + k:5d} | {line}" for k, line in enumerate(block.code.rstrip("\n").split("\n"))
                )
                details = "".join(traceback.format_exception(exc))
                chosen = f" (with the {tab!r} tabs)" if tab else ""
                pytest.fail(
                    f"{_page_id(page)}{chosen}: the python block at line {block.line} failed:\n\n{numbered}\n\n"
                    f"{details}",
                    pytrace=False,
                )
    finally:
        sys.modules.pop(module_name, None)


@pytest.mark.filterwarnings("error", "ignore::DeprecationWarning", "ignore::PendingDeprecationWarning")
@pytest.mark.parametrize("page", doc_pages(), ids=_page_id)
def test_page_examples_run(page: Path, tmp_path, monkeypatch, clean_globals) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    _single_threaded()
    run_page(page)


_LATER_TABS = [(page, label) for page in doc_pages() for label in later_tab_labels(page.read_text(encoding="utf-8"))]


@pytest.mark.filterwarnings("error", "ignore::DeprecationWarning", "ignore::PendingDeprecationWarning")
@pytest.mark.parametrize(("page", "tab"), _LATER_TABS, ids=[f"{_page_id(p)}[{t}]" for p, t in _LATER_TABS])
def test_page_examples_run_with_tab(page: Path, tab: str, tmp_path, monkeypatch, clean_globals) -> None:
    """The page run again with a later content tab chosen (paddle's code in place of torch's)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(tmp_path)
    _single_threaded()
    run_page(page, tab)


def tab_page_test(label: str):
    """A test running each page that has a ``label`` tab with it chosen, for that framework's own suite."""
    pages = pages_with_tab(label)
    assert pages, f"no page of docs/ has a {label!r} content tab any more"

    @pytest.mark.timeout(600)
    @pytest.mark.parametrize("page", pages, ids=_page_id)
    def test_page_runs_with_its_tabs(page: Path, tmp_path, monkeypatch, clean_globals) -> None:
        monkeypatch.chdir(tmp_path)
        run_page(page, label)

    return test_page_runs_with_its_tabs


def _all_code_text() -> str:
    """Code of every page: fenced blocks of any kind and inline `code` spans."""
    parts = []
    for page in doc_pages():
        text = page.read_text(encoding="utf-8")
        parts += [b.code for b in code_blocks(text)]
        parts += re.findall(r"`([^`\n]+)`", text)
    return "\n".join(parts)


def test_every_public_name_is_documented() -> None:
    import drivetrain

    code = _all_code_text()
    missing = [name for name in drivetrain.__all__
               if name != "__version__" and not re.search(rf"(?<![\w.]){re.escape(name)}\b", code)]
    assert not missing, f"public names that no page of docs/ shows in code: {missing}"


def test_every_event_is_on_the_callbacks_page() -> None:
    from drivetrain._callbacks.events import EVENT_ARGS

    text = CALLBACKS_PAGE.read_text(encoding="utf-8")
    missing = [name for name in EVENT_ARGS if not re.search(rf"\b{name}\b", text)]
    assert not missing, f"{CALLBACKS_PAGE.relative_to(ROOT)} does not mention the event(s) {missing}"


def test_index_links_to_every_page() -> None:
    index = DOCS / "index.md"
    targets = {(index.parent / link).resolve() for link in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)",
                                                                      index.read_text(encoding="utf-8"))}
    unlinked = [_page_id(p) for p in doc_pages() if p != index and p.resolve() not in targets]
    assert not unlinked, f"docs/index.md does not link to {unlinked}"


NUMPY_INSTALL = "pip install -e examples/third_party_backend"


def test_pages_using_the_numpy_example_backend_say_how_to_install_it() -> None:
    """The example backend is not on any index: a page that uses it says how to install it, before its first use."""
    silent = []
    for page in doc_pages():
        text = page.read_text(encoding="utf-8")
        uses = [b.line for b in code_blocks(text) if b.info.startswith("python")
                and re.search(r"drivetrain_numpy|driver=\"numpy\"", b.code)]
        if uses and NUMPY_INSTALL not in "\n".join(text.splitlines()[:uses[0]]):
            silent.append(_page_id(page))
    assert not silent, f"pages using drivetrain_numpy without `{NUMPY_INSTALL}` before its first use: {silent}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    fence = None
    for line in page.read_text(encoding="utf-8").splitlines():
        match = _FENCE.match(line)
        if fence is None and match is not None:
            fence = match["fence"]
        elif fence is not None:  # inside a code block: only its closing fence matters
            if match is not None and match["fence"].startswith(fence) and not match["info"].strip():
                fence = None
        else:
            heading = re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
            if heading:
                anchors.add(_slug(heading[1]))
            anchors.update(re.findall(r'<a id="([^"]+)"></a>', line))
    return anchors


def test_links_between_pages_resolve() -> None:
    broken = []
    for page in doc_pages():
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # an external address
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.is_file():
                broken.append(f"{_page_id(page)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{_page_id(page)}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_output_checks() -> None:
    assert expected_output("a ... c", "a b\n  c")
    assert expected_output("x=1\n...\nz=3", "x=1\ny=2\nz=3")
    assert not expected_output("a c", "a b c")
    assert not expected_output("a", "a\nb")
    code = checked_prints("if True:\n    print(1)  # prints 1\n    # and more\nx = 2\n", 10)
    assert code.split("\n")[1] == "    with __docs_expect__(11, '1  and more'): print(1)"
    assert code.count("\n") == 4


def test_code_blocks_in_content_tabs() -> None:
    text = ('=== "torch"\n\n    ```python\n    a = 1\n    ```\n\n=== "paddle"\n\n    ```python\n    b = 2\n    ```\n\n'
            '=== "jittor"\n\n    ```python no-run\n    c = 3\n    ```\n\ntext\n\n    ```python\n    not a fence\n    ```\n'
            '\n=== "torch"\n\n    ```python\n    d = 4\n    ```\n')
    blocks = code_blocks(text)
    assert [b.tab_set for b in blocks] == [0, 0, 0, 1]
    assert [b.line for b in blocks_to_run(text)] == [4, 28]
    assert [b.line for b in blocks_to_run(text, "paddle")] == [10, 28]
    assert [b.line for b in blocks_to_run(text, "jittor")] == [16, 28]
    assert later_tab_labels(text) == ["paddle"]
    assert [(b.info, b.line, b.code, b.tab, b.later_tab) for b in blocks] == [
        ("python", 4, "a = 1\n", "torch", False), ("python", 10, "b = 2\n", "paddle", True),
        ("python no-run", 16, "c = 3\n", "jittor", True), ("python", 28, "d = 4\n", "torch", False)]


def test_code_block_parser() -> None:
    text = "intro\n```python\na = 1\n```\n\n```python no-run\nb = 2\n```\n~~~~python\nc = '```'\n~~~~\n"
    blocks = code_blocks(text)
    assert [(b.info, b.line, b.code) for b in blocks] == [
        ("python", 3, "a = 1\n"), ("python no-run", 7, "b = 2\n"), ("python", 10, "c = '```'\n")]
