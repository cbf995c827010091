"""The backend author guide covers the whole contract, and keeps covering it as the contract grows.

The guide is an entry page, docs/backend-author-guide.md (a driver through the conformance kit),
and one page per group of the contract under docs/backend-author/. Every list below is derived by
introspection (the Driver class, the pluggy hookspecs, the dataclass fields, the helper modules'
``__all__``, the plugin module's environment variables), so a method, hook, field, helper or
variable added later without a word on one of these pages makes one of these tests fail and
names what is missing. A name counts as documented when an inline code span of a page's prose
starts with it (`name`, `name(args)`, `Driver.name`, `NAME=1`); code blocks do not count.
The pages together stay short enough to read: at most ``MAX_LINES`` lines.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "backend-author-guide.md"  # the entry page
GROUP_PAGES = ROOT / "docs" / "backend-author"  # one page per group, each linked from the entry page
INDEX = ROOT / "docs" / "index.md"
EXTENSION_PAGE = GROUP_PAGES / "engines.md"  # "Building on another backend"
MAX_LINES = 1000
TORCH_EXTENSION = ROOT / "backends" / "torch" / "drivetrain_torch" / "extension.py"

# Protected hooks a backend is meant to override (everything else starting with "_" is internal).
OVERRIDABLE_PRIVATE = ("_check_optimizer", "_wrapped_model_call")
# The plugin controls (also read from the plugin module, so new ones are picked up).
PLUGIN_ENV_VARS = (
    "DRIVETRAIN_PLUGINS_ALLOW",
    "DRIVETRAIN_PLUGINS_DENY",
    "DRIVETRAIN_STRICT_PLUGINS",
    "DRIVETRAIN_TRACE_PLUGINS",
)

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def prose(text: str) -> str:
    """The text with fenced code blocks removed."""
    kept, fence = [], None
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence is None and match:
            fence = match[1]
        elif fence is not None and match and match[1].startswith(fence) and not line.strip(" `~"):
            fence = None
        elif fence is None:
            kept.append(line)
    return "\n".join(kept)


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", prose(text))


def mentioned(names: list[str], text: str) -> list[str]:
    """The names no code span of ``text``'s prose starts with (allowing a ``module.`` / ``Class.`` prefix)."""
    spans = code_spans(text)
    return [name for name in names
            if not any(re.match(rf"(?:[\w.]+\.)?{re.escape(name)}(?!\w)", span) for span in spans)]


def pages() -> list[Path]:
    """The entry page, then every group page."""
    return [GUIDE, *sorted(GROUP_PAGES.glob("*.md"))]


@pytest.fixture(scope="module")
def guide() -> str:
    """Every page of the guide, one after the other."""
    return "\n\n".join(page.read_text(encoding="utf-8") for page in pages())


# ----------------------------------------------------------------- what is derived
def driver_members() -> list[str]:
    """Public methods, properties and class attributes of Driver, its overridable hooks, and the
    attributes its constructor sets (found by building a minimal concrete subclass)."""
    from drivetrain import Driver

    names = [name for name in vars(Driver) if not name.startswith("_")]
    names += [name for name in OVERRIDABLE_PRIVATE if name in vars(Driver)]
    probe_class = type("Probe", (Driver,), {name: lambda self, *a, **k: None for name in Driver.__abstractmethods__})
    probe = probe_class(object())
    names += [name for name in vars(probe) if not name.startswith("_") and name not in names]
    return names


def hookspecs() -> list[str]:
    from drivetrain.backend._plugins import PROJECT, DrivetrainHookspecs

    marker = f"{PROJECT}_spec"  # the attribute pluggy's HookspecMarker puts on each hookspec
    return [name for name, fn in vars(DrivetrainHookspecs).items() if hasattr(fn, marker)]


def dataclass_fields() -> dict[str, list[str]]:
    from drivetrain import Capabilities, DriverSpec
    from drivetrain.testing import BackendKit

    return {cls.__name__: [f.name for f in dataclasses.fields(cls)] for cls in (DriverSpec, Capabilities, BackendKit)}


def helper_names() -> dict[str, list[str]]:
    import drivetrain.backend
    import drivetrain.testing

    return {module.__name__: list(module.__all__) for module in (drivetrain.backend, drivetrain.testing)}


def extension_names() -> list[str]:
    """``drivetrain_torch.extension``'s ``__all__`` and ``SUBCLASS_HOOKS``, read from its source (no torch needed)."""
    names: list[str] = []
    for node in ast.parse(TORCH_EXTENSION.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) in ("__all__", "SUBCLASS_HOOKS")
                                                for t in node.targets):
            names += [name for name in ast.literal_eval(node.value) if name not in names]
    return names


def plugin_env_vars() -> list[str]:
    from drivetrain.backend import _plugins

    found = {value for name, value in vars(_plugins).items()
             if name.endswith("_ENV") and isinstance(value, str) and value.startswith("DRIVETRAIN_")}
    return sorted(found | set(PLUGIN_ENV_VARS))


# -------------------------------------------------------------------------- tests
def test_the_derived_lists_are_not_empty() -> None:
    """Guards the introspection itself: a test over an empty list could never fail."""
    members = driver_members()
    for expected in ("backward", "rank", "capabilities", "_check_optimizer", "optimizers", "grad_clip"):
        assert expected in members, f"driver_members() misses {expected!r}: {members}"
    assert "drivetrain_driver_specs" in hookspecs()
    fields = dataclass_fields()
    assert "contract_versions" in fields["DriverSpec"] and "notes" in fields["Capabilities"]
    assert "make_model" in fields["BackendKit"]
    helpers = helper_names()
    assert "move_nested" in helpers["drivetrain.backend"] and "ContractSuite" in helpers["drivetrain.testing"]
    assert set(PLUGIN_ENV_VARS) <= set(plugin_env_vars())
    extension = extension_names()
    assert "TorchDDPDriver" in extension and "ShardReader" in extension and "_join" in extension


def test_every_driver_method_and_attribute_is_documented(guide: str) -> None:
    missing = mentioned(driver_members(), guide)
    assert not missing, (f"the author guide's pages do not document the Driver member(s) {missing}; describe each "
                         "on the page of its group: what it must do, when the core calls it, its default")


def test_every_driver_member_has_its_own_entry_on_a_group_page() -> None:
    entries = {name for page in pages()
               for name in re.findall(r"^- `(\w+)", prose(page.read_text(encoding="utf-8")), flags=re.MULTILINE)}
    missing = [name for name in driver_members() if name not in entries]
    assert not missing, (f"no page of the author guide has a '- `name` ...' entry for {missing}; give each Driver "
                         "member its own bullet on the page of its group")


def test_required_marks_match_the_abstract_methods() -> None:
    from drivetrain import Driver

    marked = {name for page in pages() for name in re.findall(
        r"^- `(\w+)[^\n]*\*\*required\*\*", prose(page.read_text(encoding="utf-8")), flags=re.MULTILINE)}
    abstract = set(Driver.__abstractmethods__)
    assert marked == abstract, (
        f"entries marked **required** on the author guide's pages differ from Driver's abstract methods: "
        f"not marked {sorted(abstract - marked)}, marked but not abstract {sorted(marked - abstract)}"
    )


def test_every_hook_is_documented(guide: str) -> None:
    missing = mentioned(hookspecs(), guide)
    assert not missing, f"the author guide's pages do not document the hook(s) {missing} of DrivetrainHookspecs"


@pytest.mark.parametrize("cls", ["DriverSpec", "Capabilities", "BackendKit"])
def test_every_field_is_documented(guide: str, cls: str) -> None:
    missing = mentioned(dataclass_fields()[cls], guide)
    assert not missing, f"the author guide's pages do not document the {cls} field(s) {missing}"


@pytest.mark.parametrize("module", ["drivetrain.backend", "drivetrain.testing"])
def test_every_helper_is_documented(guide: str, module: str) -> None:
    missing = mentioned(helper_names()[module], guide)
    assert not missing, f"the author guide's pages do not document {module}.__all__ name(s) {missing}"


def test_every_name_of_the_torch_extension_api_is_documented() -> None:
    """What an engine on torch may use (drivetrain_torch.extension) is listed on "Building on another backend"."""
    missing = mentioned(extension_names(), EXTENSION_PAGE.read_text(encoding="utf-8"))
    assert not missing, (f"{EXTENSION_PAGE.relative_to(ROOT)} does not document the drivetrain_torch.extension "
                         f"name(s) {missing}; say what each does for an engine built on torch")


def test_every_plugin_environment_variable_is_documented(guide: str) -> None:
    missing = mentioned(plugin_env_vars(), guide)
    assert not missing, f"the author guide's pages do not document the environment variable(s) {missing}"


def test_the_check_command_and_contract_version_are_documented(guide: str) -> None:
    entry = GUIDE.read_text(encoding="utf-8")
    assert any(span.startswith("drivetrain backends --check") for span in code_spans(entry)), \
        "the entry page does not show `drivetrain backends --check NAME`"
    assert mentioned(["BackendKit", "ContractSuite", "run_contract_checks"], entry) == [], \
        "the entry page must take a driver through the conformance kit"
    assert mentioned(["CONTRACT_VERSION", "register_plugin", "hookimpl"], guide) == []


def test_index_links_the_guide() -> None:
    links = re.findall(r"\]\(([^)#\s]+)", INDEX.read_text(encoding="utf-8"))
    assert "backend-author-guide.md" in links, "docs/index.md must link to backend-author-guide.md"


def test_the_entry_page_links_every_group_page() -> None:
    """A reader starts on the entry page and goes from there to the groups they need."""
    text = GUIDE.read_text(encoding="utf-8")
    linked = {(GUIDE.parent / link).resolve() for link in re.findall(r"\]\(([^)#\s]+\.md)", text)}
    unlinked = [page.name for page in pages()[1:] if page.resolve() not in linked]
    assert len(pages()) > 1, f"no group pages in {GROUP_PAGES.relative_to(ROOT)}"
    assert not unlinked, f"{GUIDE.relative_to(ROOT)} does not link to the group page(s) {unlinked}"


def test_the_guide_stays_short() -> None:
    counts = {page.relative_to(ROOT).as_posix(): len(page.read_text(encoding="utf-8").splitlines())
              for page in pages()}
    assert sum(counts.values()) <= MAX_LINES, (
        f"the author guide has {sum(counts.values())} lines (more than {MAX_LINES}): {counts}; link to the API "
        "reference (docs/api/backend.md renders the docstrings) instead of repeating what a docstring says")


def test_the_matcher_itself() -> None:
    text = "Use `Driver.backward(loss)` and `seed`; not `seeds`.\n```python\nrng_state()\n```\n`X=1` `a.b.c_d`\n"
    assert mentioned(["backward", "seed", "rng_state", "X", "c_d", "see"], text) == ["rng_state", "see"]
