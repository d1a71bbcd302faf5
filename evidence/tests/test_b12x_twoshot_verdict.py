"""The two-shot check's verdict names stock b12x's launcher-contract failure wherever b12x puts
it in the message, and calls anything else a failure."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "b12x_twoshot_gpu.py"
_spec = importlib.util.spec_from_file_location("b12x_twoshot_gpu", _PATH)
twoshot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(twoshot)

WRAPPED = (
    "RuntimeError: b12x two-shot preparation failed: "
    "TypeError: executable carrier has no explicit dependencies: function"
)


def _world(*errors):
    ops = [{"passed": False, "error": e} if e else {"passed": True} for e in errors]
    return {"ranks": [{"operations": {f"op{i}": op}} for i, op in enumerate(ops)]}


@pytest.mark.parametrize(
    "errors, verdict",
    [
        ((None, None), "passed"),
        (
            (WRAPPED, "TypeError: compile factory returned an unannotated function"),
            "failed-before-launch(compile factory returned an unannotated function"
            " | executable carrier has no explicit dependencies)",
        ),
        ((WRAPPED, "AssertionError: max error 0.5 over tolerance"), "failed"),
        ((WRAPPED, None), "failed"),
    ],
)
def test_verdict_finds_the_contract_error_inside_a_wrapped_message(errors, verdict):
    assert twoshot._verdict(_world(*errors)) == verdict


def test_a_rank_without_result_is_no_result():
    world = {"ranks": [{"operations": {"a": {"passed": True}}}, {"no_result": True}]}
    assert twoshot._verdict(world) == "no-result"
