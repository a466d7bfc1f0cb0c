"""The model-parallel examples under the launcher at 2 ranks, small size: each checks its result
against the same model in one process and exits non-zero on a mismatch."""
import pytest

from conftest import ROOT, launch

EXAMPLES = ROOT / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_parallel_matches_one_process(schedule):
    p = launch(2, str(EXAMPLES / "pipeline_parallel.py"), "--schedule", schedule, "--steps", "3",
               timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(f"pipeline {schedule} matches the one-process model") == 2
    assert "MISMATCH" not in p.stdout


@pytest.mark.slow
def test_pipeline_parallel_check_catches_a_wrong_gradient():
    p = launch(2, str(EXAMPLES / "pipeline_parallel.py"), "--corrupt", "--steps", "2", timeout=60)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "MISMATCH parameter" in p.stdout, p.stdout + p.stderr


def _has_alltoallv() -> bool:
    import gradwire
    return gradwire.has_collective("alltoallv")


@pytest.mark.slow
@pytest.mark.parametrize("np_", [2, 3])
def test_moe_alltoall_matches_one_process(np_):
    if not _has_alltoallv():
        pytest.skip("the library under test has no gw_alltoallv (uneven all-to-all)")
    p = launch(np_, str(EXAMPLES / "moe_alltoall.py"), timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("matches the one-process layer") == np_


@pytest.mark.slow
def test_moe_alltoall_check_catches_a_wrong_expert():
    if not _has_alltoallv():
        pytest.skip("the library under test has no gw_alltoallv (uneven all-to-all)")
    p = launch(2, str(EXAMPLES / "moe_alltoall.py"), "--corrupt", timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "MISMATCH" in p.stdout, p.stdout + p.stderr
