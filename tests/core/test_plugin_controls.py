"""Plugin controls and refusals (issue 9): allow/deny lists, strict and trace modes, duplicate names,
malformed descriptions, contract versions, and ``drivetrain backends --check``.

Each case installs a real (fake) distribution through a ``*.dist-info`` folder on PYTHONPATH and
runs discovery in a fresh interpreter, so the entry-point machinery is the real one.
"""

from __future__ import annotations

import io
import textwrap

import pytest

import drivetrain
from drivetrain import DriverNotFoundError, DriverSpec, PluginLoadError, hookimpl
from drivetrain._cli import _check
from drivetrain.backend._plugins import reset_registry, resolve_spec

from .test_plugins import make_broken_plugin, run_python

DISCOVER = """
    import warnings
    import drivetrain
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        specs = drivetrain.available_drivers()
    print("SPECS", sorted(specs))
    for w in caught:
        print("WARN", w.message)
    import sys
    print("IMPORTED", sorted(m for m in sys.modules if m.endswith("_plugin")))
"""


def make_plugin(root, dist: str, module: str, body: str, entry: str | None = None) -> str:
    """A distribution ``dist`` whose ``drivetrain`` entry point ``entry`` is the module ``module`` with ``body``."""
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[drivetrain]\n{entry or module} = {module}\n")
    (root / f"{module}.py").write_text(textwrap.dedent(body))
    return str(root)


SPECS_RETURNING = """
    from drivetrain import CONTRACT_VERSION, DriverSpec, hookimpl

    @hookimpl
    def drivetrain_driver_specs():
        return {answer}
"""


def spec_plugin(root, dist, module, answer: str) -> str:
    return make_plugin(root, dist, module, SPECS_RETURNING.format(answer=answer))


def test_entry_point_naming_a_missing_module_names_the_distribution(tmp_path):
    info = tmp_path / "ghost_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ghost-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[drivetrain]\nghost = ghost_backend_plugin:not_there\n")
    result = run_python(DISCOVER, extra_path=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "'numpy'" in result.stdout.split("SPECS")[1].splitlines()[0]
    assert ("ghost-backend's entry point `ghost = ghost_backend_plugin:not_there` (group 'drivetrain') cannot be "
            "loaded: ModuleNotFoundError") in result.stdout
    assert "Fix the entry point in ghost-backend's pyproject.toml" in result.stdout


def test_entry_point_naming_a_missing_object_names_the_distribution(tmp_path):
    path = make_plugin(tmp_path, "half-backend", "half_plugin", "x = 1\n", entry="half")
    # the entry point names an attribute the module does not have
    (tmp_path / "half_backend-1.0.dist-info" / "entry_points.txt").write_text("[drivetrain]\nhalf = half_plugin:specs\n")
    result = run_python(DISCOVER, extra_path=path)
    assert "half-backend's entry point `half = half_plugin:specs`" in result.stdout
    assert "AttributeError" in result.stdout


def test_a_driver_name_taken_twice_names_both_distributions(tmp_path):
    path = spec_plugin(tmp_path, "numpy-clone", "clone_plugin",
                       '[DriverSpec(name="numpy", framework="numpy", factory="json:loads", '
                       'contract_versions=(CONTRACT_VERSION,))]')
    result = run_python(DISCOVER, extra_path=path)
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stdout.splitlines() if "registered by both" in line)
    assert "numpy-clone" in warning and "drivetrain-numpy" in warning
    assert "DRIVETRAIN_PLUGINS_DENY=<its plugin name>" in warning
    assert "'numpy'" in result.stdout  # one of them still serves the name


@pytest.mark.parametrize("answer, complaint", [
    ('{"name": "dictspec"}', "it returned a dict; it must return a list of drivetrain.DriverSpec"),
    ('["torch"]', "it returned a str in its list"),
    ('[DriverSpec(name="", framework="numpy", factory="json:loads", contract_versions=(1,))]',
     "is malformed: name='' must be a non-empty name"),
    ('[DriverSpec(name="nofactory", framework="numpy", factory="json.loads", contract_versions=(1,))]',
     "factory='json.loads' must be 'package.module:function'"),
    ('[DriverSpec(name="badversion", framework="numpy", factory="json:loads", contract_versions=1)]',
     "contract_versions=1 must be a tuple of ints"),
])
def test_a_malformed_description_is_refused_and_the_others_work(tmp_path, answer, complaint):
    path = spec_plugin(tmp_path, "odd-backend", "odd_plugin", answer)
    result = run_python(DISCOVER, extra_path=path)
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stdout.splitlines() if line.startswith("WARN drivetrain plugin 'odd_plugin'"))
    assert "odd-backend: drivetrain_driver_specs() failed" in warning and complaint in warning, warning
    assert "'numpy'" in result.stdout


def test_strict_mode_refuses_a_duplicate_name(tmp_path):
    path = spec_plugin(tmp_path, "numpy-clone", "clone_plugin",
                       '[DriverSpec(name="numpy", framework="numpy", factory="json:loads", contract_versions=(1,))]')
    result = run_python(DISCOVER, extra_path=path, env={"DRIVETRAIN_STRICT_PLUGINS": "1"})
    assert result.returncode != 0
    assert "PluginLoadError" in result.stderr and "registered by both" in result.stderr


def test_deny_list_skips_a_plugin_without_importing_it(tmp_path):
    path = make_broken_plugin(tmp_path)
    result = run_python(DISCOVER, extra_path=path, env={"DRIVETRAIN_PLUGINS_DENY": "broken"})
    assert result.returncode == 0, result.stderr
    assert "WARN" not in result.stdout and "broken_backend_plugin" not in result.stdout
    assert "'numpy'" in result.stdout


def test_allow_list_loads_only_the_named_plugins(tmp_path):
    path = make_broken_plugin(tmp_path)
    result = run_python(DISCOVER, extra_path=path, env={"DRIVETRAIN_PLUGINS_ALLOW": "numpy"})
    assert result.returncode == 0, result.stderr
    assert "SPECS ['numpy']" in result.stdout and "WARN" not in result.stdout


def test_deny_list_by_driver_name(tmp_path):
    result = run_python(DISCOVER, env={"DRIVETRAIN_PLUGINS_DENY": " numpy , other"})
    assert "'numpy'" not in result.stdout.split("SPECS")[1].splitlines()[0]


def test_trace_mode_logs_which_plugin_answered_which_hook(tmp_path):
    path = make_broken_plugin(tmp_path)
    result = run_python(DISCOVER, extra_path=path, env={"DRIVETRAIN_TRACE_PLUGINS": "1"})
    assert result.returncode == 0, result.stderr
    trace = result.stderr
    assert "drivetrain.plugins: plugin 'numpy' loaded from drivetrain-numpy (drivetrain_numpy.plugin)" in trace
    assert ("drivetrain.plugins: hook drivetrain_driver_specs answered by plugin 'numpy' (drivetrain-numpy): "
            "['numpy']") in trace
    assert "drivetrain.plugins: plugin 'broken' refused: broken-backend's entry point" in trace


def test_no_trace_without_the_variable():
    result = run_python(DISCOVER, env={"DRIVETRAIN_TRACE_PLUGINS": ""})
    assert "drivetrain.plugins:" not in result.stderr


# ------------------------------------------------------------ contract versions (in process)
class _Versioned:
    def __init__(self, name: str, versions: tuple[int, ...]) -> None:
        self.spec = DriverSpec(name=name, framework="json", factory="json:loads", contract_versions=versions,
                               distribution=f"drivetrain-{name}")

    @hookimpl
    def drivetrain_driver_specs(self):
        return [self.spec]


@pytest.fixture
def registered():
    plugins = []

    def register(name: str, versions: tuple[int, ...]) -> None:
        drivetrain.register_plugin(_Versioned(name, versions), name=f"{name}-plugin")
        plugins.append(name)

    yield register
    reset_registry()


def test_a_newer_contract_says_upgrade_drivetrain(registered):
    registered("future", (drivetrain.CONTRACT_VERSION + 1,))
    with pytest.raises(DriverNotFoundError, match=r"drivetrain-future implements driver contract version\(s\) 2, "
                       r"newer than drivetrain .* version 1\. Upgrade drivetrain: in your drivetrain checkout, git pull, "
                       r"then pip install -e \. \(once drivetrain is published: pip install --upgrade drivetrain\)"):
        resolve_spec("future", None)


def test_a_backend_supporting_several_versions_is_accepted(registered):
    registered("span", (drivetrain.CONTRACT_VERSION, drivetrain.CONTRACT_VERSION + 1))
    assert resolve_spec("span", None).name == "span"


def test_cli_shows_the_incompatibility_and_the_fix(registered, capsys):
    from drivetrain._cli import main

    registered("ancient", (0,))
    main(["backends"])
    out = capsys.readouterr().out
    section = out.split("\nancient\n")[1]
    assert "contract:     [0] (compatible: NO)" in section
    assert "fix:          drivetrain-ancient implements driver contract version(s) 0, older than" in section


def test_check_refuses_an_incompatible_backend(registered):
    registered("ancient", (0,))
    out = io.StringIO()
    assert _check("ancient", out) == 2
    assert "cannot check 'ancient': drivetrain-ancient implements driver contract version(s) 0" in out.getvalue()


# --------------------------------------------------------------------------- --check
def sloppy_kit():
    """The numpy kit, pointed at a driver whose zero_grad forgets to clear the gradients."""
    from drivetrain_numpy.testing_kit import numpy_kit

    kit = numpy_kit()
    kit.driver = "sloppy"
    return kit


def create_sloppy_driver(model, device, **options):
    from drivetrain_numpy.driver import create_driver

    driver = create_driver(model, device, **options)
    driver.name = "sloppy"
    driver.zero_grad = lambda: None
    return driver


class _Sloppy:
    @hookimpl
    def drivetrain_driver_specs(self):
        return [DriverSpec(name="sloppy", framework="numpy", factory=f"{__name__}:create_sloppy_driver",
                           model_modules=("no_such_module",), contract_versions=(drivetrain.CONTRACT_VERSION,),
                           testing_kit=f"{__name__}:sloppy_kit")]


def test_check_prints_a_table_and_names_the_broken_rule():
    try:
        drivetrain.register_plugin(_Sloppy(), name="sloppy-plugin")
        out = io.StringIO()
        assert _check("sloppy", out) == 1
    finally:
        reset_registry()
    text = out.getvalue()
    assert "optimisation  FAIL    4/5" in text, text
    assert "data          PASS    2/2" in text
    assert "FAILED backward_step_zero_grad: [optimisation] forward_backward + step change the parameters; zero_grad " \
           "clears the gradients" in text
    assert "step() right after zero_grad() moved the parameters" in text


def waiving_kit():
    """The sloppy kit, waiving the check its driver breaks (with the reason)."""
    kit = sloppy_kit()
    kit.waived = {"backward_step_zero_grad": "this driver keeps gradients on purpose"}
    return kit


def typo_kit():
    kit = sloppy_kit()
    kit.waived = {"backward_step_zero_grads": "a typo"}
    return kit


def _check_with_kit(kit: str) -> tuple[int, str]:
    class Plugin:
        @hookimpl
        def drivetrain_driver_specs(self):
            return [DriverSpec(name="sloppy", framework="numpy", factory=f"{__name__}:create_sloppy_driver",
                               contract_versions=(drivetrain.CONTRACT_VERSION,), testing_kit=f"{__name__}:{kit}")]

    try:
        drivetrain.register_plugin(Plugin(), name="sloppy-plugin")
        out = io.StringIO()
        code = _check("sloppy", out)
    finally:
        reset_registry()
    return code, out.getvalue()


def test_a_waived_check_is_not_run_and_is_reported_with_its_reason():
    code, text = _check_with_kit("waiving_kit")
    assert code == 0, text
    assert "optimisation  PASS    4/4" in text, text
    assert "WAIVED backward_step_zero_grad ([optimisation] forward_backward + step change the parameters" in text
    assert "this driver keeps gradients on purpose" in text
    assert "21/21 checks passed, 1 waived by the kit" in text  # discovery too: it claims no model, like an engine


def test_contract_suite_skips_a_waived_check_with_the_reason():
    import unittest

    from drivetrain.testing import ContractSuite

    class Waiving(ContractSuite):
        def make_kit(self):
            return waiving_kit()

    with pytest.raises(unittest.SkipTest, match="waived by the kit: this driver keeps gradients on purpose"):
        Waiving().test_optimisation__backward_step_zero_grad()


def test_a_waiver_naming_no_check_is_refused():
    code, text = _check_with_kit("typo_kit")
    assert code == 2
    assert "BackendKit(waived=...) names no check ['backward_step_zero_grads']" in text


def engine_kit():
    from drivetrain_numpy.testing_kit import numpy_kit

    kit = numpy_kit()
    kit.driver, kit.framework = "numpy_engine", "numpy"
    return kit


def create_engine_driver(model, device, **options):
    from drivetrain_numpy.driver import create_driver

    driver = create_driver(model, device, **options)
    driver.name = "numpy_engine"
    return driver


def test_an_engine_that_claims_no_model_is_checked_by_name():
    """An engine on another backend (model_modules=()) leaves driver='auto' to that backend; discovery passes."""
    from drivetrain.testing import run_contract_checks

    class Engine:
        @hookimpl
        def drivetrain_driver_specs(self):
            return [DriverSpec(name="numpy_engine", framework="numpy", factory=f"{__name__}:create_engine_driver",
                               contract_versions=(drivetrain.CONTRACT_VERSION,))]

    try:
        drivetrain.register_plugin(Engine(), name="engine-plugin")
        (result,) = run_contract_checks(engine_kit(), groups=("discovery",))
        assert resolve_spec("auto", engine_kit().make_model()).name == "numpy"
    finally:
        reset_registry()
    assert result.passed, result.error


def test_check_without_a_kit_says_how_to_declare_one(registered):
    registered("kitless", (drivetrain.CONTRACT_VERSION,))
    out = io.StringIO()
    assert _check("kitless", out) == 2
    assert "declares no testing kit; its DriverSpec needs testing_kit='package.module:function'" in out.getvalue()


def test_strict_plugin_error_class_is_public():
    assert issubclass(PluginLoadError, ImportError)


def test_auto_prefers_a_backend_that_can_be_used(registered):
    """Two backends claim a model; the first one found implements another contract: auto takes the other."""
    class Claiming:
        def __init__(self, name, versions):
            self.spec = DriverSpec(name=name, framework="json", factory="json:loads", contract_versions=versions,
                                   model_modules=("fractions",))

        @hookimpl
        def drivetrain_driver_specs(self):
            return [self.spec]

    from fractions import Fraction

    drivetrain.register_plugin(Claiming("stale", (0,)), name="stale-plugin")
    drivetrain.register_plugin(Claiming("fresh", (drivetrain.CONTRACT_VERSION,)), name="fresh-plugin")
    assert resolve_spec("auto", Fraction(1, 2)).name == "fresh"


def test_cli_says_a_denied_backend_is_left_out_not_missing(tmp_path):
    result = run_python("from drivetrain._cli import main; main(['backends'])",
                        env={"DRIVETRAIN_PLUGINS_DENY": "numpy"})
    assert "left out by DRIVETRAIN_PLUGINS_ALLOW/DRIVETRAIN_PLUGINS_DENY: numpy (drivetrain-numpy)" in result.stdout
    assert "\nnumpy\n" not in result.stdout


def test_duplicate_message_uses_the_specs_distribution(tmp_path):
    path = spec_plugin(tmp_path, "clone-dist", "clone_plugin",
                       '[DriverSpec(name="numpy", framework="numpy", factory="json:loads", contract_versions=(1,), '
                       'distribution="drivetrain-numpy-clone")]')
    result = run_python(DISCOVER, extra_path=path)
    warning = next(line for line in result.stdout.splitlines() if "registered by both" in line)
    assert "drivetrain-numpy-clone" in warning and "drivetrain-numpy " in warning
