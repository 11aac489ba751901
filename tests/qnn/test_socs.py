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
