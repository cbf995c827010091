"""Plugin discovery through real entry points: lazy, tolerant of broken plugins, and explained by the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

FRAMEWORKS = ("torch", "paddle", "jittor", "oneflow")


def run_python(code: str, extra_path: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = dict(os.environ)
    if extra_path:
        environ["PYTHONPATH"] = extra_path + os.pathsep + environ.get("PYTHONPATH", "")
    environ.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=environ, timeout=120)


def make_broken_plugin(root) -> str:
    """A real installed distribution whose `drivetrain` entry point fails to import."""
    dist = root / "broken_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[drivetrain]\nbroken = broken_backend_plugin\n")
    (root / "broken_backend_plugin.py").write_text("raise RuntimeError('this plugin is broken on purpose')\n")
    return str(root)


def test_import_and_discovery_import_no_framework():
    result = run_python(f"""
        import sys
        import drivetrain
        specs = drivetrain.available_drivers()
        assert "numpy" in specs, specs
        from drivetrain._cli import main
        main(["backends"])
        loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]
        print("LOADED", loaded)
    """)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout


def test_broken_plugin_warns_and_others_still_work(tmp_path):
    path = make_broken_plugin(tmp_path)
    result = run_python("""
        import warnings
        warnings.simplefilter("always")
        import drivetrain
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            specs = drivetrain.available_drivers()
        print("SPECS", sorted(specs))
        print("WARN", [str(w.message) for w in caught])
    """, extra_path=path)
    assert result.returncode == 0, result.stderr
    assert "'numpy'" in result.stdout
    assert "drivetrain plugin 'broken' is skipped: broken-backend's entry point `broken = broken_backend_plugin`" \
        in result.stdout
    assert "this plugin is broken on purpose" in result.stdout and "reinstall broken-backend" in result.stdout


def test_strict_mode_makes_a_broken_plugin_an_error(tmp_path):
    path = make_broken_plugin(tmp_path)
    result = run_python("""
        import drivetrain
        drivetrain.available_drivers()
    """, extra_path=path, env={"DRIVETRAIN_STRICT_PLUGINS": "1"})
    assert result.returncode != 0
    assert "PluginLoadError" in result.stderr and "Unset DRIVETRAIN_STRICT_PLUGINS" in result.stderr


def test_cli_lists_backends_capabilities_and_broken_plugins(tmp_path):
    path = make_broken_plugin(tmp_path)
    environ = dict(os.environ, PYTHONPATH=path)
    result = subprocess.run([sys.executable, "-m", "drivetrain._cli", "backends"], capture_output=True, text=True,
                            env=environ, timeout=120)
    out = result.stdout
    assert "numpy" in out and "drivetrain-numpy 0.1.0" in out
    assert "precisions:   fp32" in out
    # a known backend not installed: the command that works from a checkout first
    assert ("jittor: from a drivetrain checkout: pip install -c constraints.txt -e . -e backends/jittor (once drivetrain "
            'is published: pip install "drivetrain[jittor]")') in out
    assert "refused plugins (skipped):" in out and "RuntimeError: this plugin is broken on purpose" in out
    assert result.returncode == 1  # broken plugins make the command fail, so CI notices


def test_plugin_registered_in_code():
    import drivetrain
    from drivetrain import Capabilities, DriverSpec, hookimpl
    from drivetrain.backend._plugins import reset_registry

    class InCode:
        @hookimpl
        def drivetrain_driver_specs(self):
            return [DriverSpec(name="incode", framework="json", factory="json:loads", contract_versions=(1,),
                               capabilities=Capabilities(), model_modules=("collections",))]

    try:
        drivetrain.register_plugin(InCode(), name="incode-plugin")
        assert "incode" in drivetrain.available_drivers()
        from collections import OrderedDict

        from drivetrain.backend._plugins import resolve_spec

        assert resolve_spec("auto", OrderedDict()).name == "incode"
    finally:
        reset_registry()
    assert "incode" not in drivetrain.available_drivers()


def test_incompatible_contract_version_is_refused():
    import drivetrain
    from drivetrain import DriverNotFoundError, DriverSpec, hookimpl
    from drivetrain.backend._plugins import reset_registry, resolve_spec

    class Old:
        @hookimpl
        def drivetrain_driver_specs(self):
            return [DriverSpec(name="old", framework="json", factory="json:loads", contract_versions=(0,))]

    try:
        drivetrain.register_plugin(Old(), name="old-plugin")
        with pytest.raises(DriverNotFoundError, match=r"implements driver contract version\(s\) 0, older than "
                           r"drivetrain .* implements driver contract version 1\. Upgrade the backend"):
            resolve_spec("old", None)
    finally:
        reset_registry()


def test_framework_module_missing_is_reported_with_install_command():
    import drivetrain
    from drivetrain import DriverNotFoundError, DriverSpec, hookimpl
    from drivetrain.backend._plugins import reset_registry, resolve_spec

    class Missing:
        @hookimpl
        def drivetrain_driver_specs(self):
            return [DriverSpec(name="ghost", framework="ghost_framework_not_installed", factory="x:y",
                               contract_versions=(1,))]

    try:
        drivetrain.register_plugin(Missing(), name="ghost-plugin")
        with pytest.raises(DriverNotFoundError, match=r"needs the framework module 'ghost_framework_not_installed'.*pip install drivetrain-ghost"):
            resolve_spec("ghost", None)
    finally:
        reset_registry()


def test_spec_without_contract_version_is_refused():
    import drivetrain
    from drivetrain import DriverNotFoundError, DriverSpec, hookimpl
    from drivetrain.backend._plugins import reset_registry, resolve_spec

    class Unversioned:
        @hookimpl
        def drivetrain_driver_specs(self):
            return [DriverSpec(name="unversioned", framework="json", factory="json:loads")]

    try:
        drivetrain.register_plugin(Unversioned(), name="unversioned-plugin")
        with pytest.raises(DriverNotFoundError, match=r"declares no driver contract version.*contract_versions=\(1,\)"):
            resolve_spec("unversioned", None)
    finally:
        reset_registry()
