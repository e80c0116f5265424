"""tailkit/native/arithmetic.py: the ``tailkit`` command pins every library's kernel choice to
the AVX2-and-FMA level unless ``TAILKIT_ISA=native``, and says which held."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tailkit.native.arithmetic import (
    OPT_OUT,
    REQUIRED_FLAGS,
    TARGET,
    arithmetic_record,
    can_pin,
    pinned_environment,
    pins,
)
from tailkit.reporting.runs import Run
from tailkit.reporting.tables import arithmetic_summary

pinnable = pytest.mark.skipif(not can_pin(), reason="not an x86-64 CPU with AVX2 and FMA")

#: What the libraries themselves report after the restart.
PROBE = """
import json
from tailkit.native.restart import restart_with_settled_environment
restart_with_settled_environment()
import numpy, threadpoolctl, torch
from numba.core import config
from tailkit.native.arithmetic import arithmetic_record
blas = [i.get("architecture") for i in threadpoolctl.threadpool_info()
        if i["internal_api"] == "openblas"]
print(json.dumps({"record": arithmetic_record(), "aten": torch.backends.cpu.get_cpu_capability(),
                  "numba": config.CPU_NAME, "features": config.CPU_FEATURES, "openblas": blas}))
"""


def probe(**env: str) -> dict:
    import os

    environ = {k: v for k, v in os.environ.items() if k not in pins() and k != OPT_OUT}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pinnable
def test_the_command_runs_every_library_at_the_pinned_level():
    seen = probe()
    assert seen["record"] == {"mode": "portable", "target": TARGET}
    assert seen["aten"] == "AVX2"
    assert seen["numba"] == TARGET and "+avx2" in seen["features"]
    assert "avx512" not in seen["features"]
    assert all(arch == "Haswell" for arch in seen["openblas"])


def test_native_leaves_each_library_to_its_own_choice():
    seen = probe(**{OPT_OUT: "native"})
    assert seen["record"]["mode"] == "native" and seen["record"]["cpu"]
    assert seen["numba"] is None


def test_a_bad_mode_is_one_line_naming_the_variable():
    done = subprocess.run(
        [sys.executable, "-m", "tailkit", "--help"],
        env={"PATH": "/usr/bin:/bin", OPT_OUT: "fastest"},
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "Error: TAILKIT_ISA: got 'fastest'; expected one of portable, native"
    ]


def test_pins_replace_a_users_own_values_and_stop_once_in_place():
    flags = REQUIRED_FLAGS | {"avx512f"}
    env = pinned_environment({"MKL_CBWR": "COMPATIBLE", "HOME": "/h"}, flags)
    if env is None:
        pytest.skip("not x86-64")
    assert env["MKL_CBWR"] == "AVX2" and env["HOME"] == "/h"
    assert all(env[k] == v for k, v in pins().items())
    assert pinned_environment(env, flags) is None


def test_no_pins_where_the_cpu_lacks_the_level_or_native_is_asked():
    assert pinned_environment({}, frozenset({"sse2", "avx"})) is None
    assert pinned_environment({OPT_OUT: "Native"}, REQUIRED_FLAGS) is None
    with pytest.raises(ValueError, match="TAILKIT_ISA"):
        pinned_environment({OPT_OUT: "avx512"}, REQUIRED_FLAGS)


def test_the_record_is_portable_only_with_every_pin(monkeypatch):
    for key, value in pins().items():
        monkeypatch.setenv(key, value)
    assert arithmetic_record() == {"mode": "portable", "target": TARGET}
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    assert arithmetic_record()["mode"] == "native"


def test_switching_the_mode_changes_every_stage_fingerprint(tmp_path, monkeypatch):
    from conftest import TINY_PARAMS

    from tailkit.params import parse_params
    from tailkit.paths import Layout
    from tailkit.registry import make_registry
    from tailkit.stages import fingerprint

    params = parse_params(TINY_PARAMS)
    for key in pins():
        monkeypatch.delenv(key, raising=False)
    native = fingerprint.run(params, Layout(tmp_path / "a"), make_registry())["stages"]
    for key, value in pins().items():
        monkeypatch.setenv(key, value)
    portable = fingerprint.run(params, Layout(tmp_path / "b"), make_registry())["stages"]
    assert native.keys() == portable.keys()
    for stage in native:
        assert native[stage]["arithmetic"]["mode"] == "native"
        assert portable[stage]["arithmetic"] == {"mode": "portable", "target": TARGET}
        assert {k: v for k, v in native[stage].items() if k != "arithmetic"} == {
            k: v for k, v in portable[stage].items() if k != "arithmetic"
        }


def test_the_report_says_how_the_bits_were_made():
    def run(name, record):
        return Run(
            name, "", None, {"plugins": {"loss": "softmax (tailkit 0.1.0)", "arithmetic": record}}
        )

    portable = {"mode": "portable", "target": TARGET, "device": "cpu"}
    native = {"mode": "native", "cpu": "AMD EPYC", "device": "cpu"}
    assert arithmetic_summary([run("a", portable), run("b", portable)]) == (
        f"Arithmetic: portable ({TARGET}) on cpu.\n"
    )
    assert arithmetic_summary([run("a", portable), run("b", native)]) == (
        f"Arithmetic: native (AMD EPYC) on cpu: b; portable ({TARGET}) on cpu: a.\n"
    )
    assert arithmetic_summary([Run("old", "", None, {"plugins": {}})]) == ""
