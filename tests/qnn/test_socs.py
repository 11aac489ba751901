"""The SoCs edgefuse lets QNN compile for: one list, sorted, without ``UNKNOWN_SM``, used by the command
line, export-llm's config check and the QNN pipeline's compiler specs."""

from __future__ import annotations

import types

import pytest

from edgefuse.qnn.socs import qnn_socs


def test_the_socs_are_sorted_and_leave_out_the_unknown_placeholder():
    socs = qnn_socs()
    assert "SM8650" in socs and "UNKNOWN_SM" not in socs and socs == sorted(socs)


def test_the_compiler_specs_refuse_an_unknown_soc_unknown_sm_included():
    from edgefuse.qnn.pipeline import compiler_specs

    for soc in ("UNKNOWN_SM", "SM9999"):
        with pytest.raises(ValueError, match=f"unknown SoC '{soc}': QNN knows {', '.join(qnn_socs())}"):
            compiler_specs(soc, "fp16")
    assert compiler_specs("SM8650", "fp16")


def test_export_llms_soc_check_refuses_unknown_sm_and_lists_the_socs_sorted():
    from edgefuse.llm.config import soc_problem

    def config(soc):
        return types.SimpleNamespace(backend=types.SimpleNamespace(qnn=types.SimpleNamespace(soc_model=soc)))

    assert soc_problem(config("SM8650")) is None
    assert soc_problem(config("UNKNOWN_SM")) == (
        f"backend.qnn.soc_model=UNKNOWN_SM: not a SoC QNN knows ({', '.join(qnn_socs())})")


def test_each_socs_htp_generation_is_executorchs_and_picks_that_generations_limits():
    from executorch.backends.qualcomm.serialization.qc_schema import QcomChipset, _soc_info_table

    from edgefuse.core.profiles import PROFILES
    from edgefuse.qnn.socs import htp_arch, qnn_profile

    for soc in qnn_socs():
        assert htp_arch(soc) == _soc_info_table[QcomChipset[soc]].htp_info.htp_arch.name
    profile, note = qnn_profile("SM8750")
    assert note == "the limits of V79, measured on SM8750" and profile.limits == PROFILES["qnn"].limits
    profile, note = qnn_profile(None)
    assert note.startswith("no SoC given: every limit measured on") and profile is PROFILES["qnn"]


def test_a_generation_that_holds_fewer_limits_gives_its_socs_fewer(monkeypatch):
    import dataclasses

    from edgefuse.core import profiles
    from edgefuse.qnn.socs import qnn_profile

    qnn = profiles.PROFILES["qnn"]
    names = frozenset(l.name for l in qnn.limits)
    v79 = profiles.Generation("V79", ("SM8750",), names, frozenset({"htp-rms-norm-rank"}))
    monkeypatch.setitem(profiles.PROFILES, "qnn", dataclasses.replace(qnn, generations=(v79,)))
    assert [l.name for l in qnn_profile("SM8750")[0].limits] == ["htp-rms-norm-rank"]
    profile, note = qnn_profile("SM8650")  # V75 is not measured in this profile: every limit
    assert profile.limits == qnn.limits and "V75 was not measured: every limit measured on V79" in note


def test_a_precision_qnn_does_not_compile_for_a_soc_is_a_problem_before_any_work():
    from edgefuse.qnn.socs import soc_problem

    assert soc_problem("SM8650", "fp16") is None and soc_problem("QCM6490", "16a8w") is None
    for soc in ("QCM6490", "SAR2230P", "SM8350", "SSG2115P", "SSG2125P", "SW6100", "SXR1230P"):
        problem = soc_problem(soc, "fp16")
        assert problem.startswith(f"--soc {soc} at fp16: QNN 2.51 does not compile an RmsNorm in fp16 for {soc}")
    assert soc_problem("SM0000", "fp16").startswith("--soc SM0000: ExecuTorch's QNN backend knows")


def test_the_limits_page_holds_the_profiles_soc_table():
    from pathlib import Path

    from edgefuse.tools.qnn_sweep import limits_table

    page = (Path(__file__).parents[2] / "docs" / "qnn-limits.md").read_text()
    table = page.split("<!-- qnn-limits-table -->\n", 1)[1].split("\n<!-- /qnn-limits-table -->", 1)[0]
    assert table == limits_table()
