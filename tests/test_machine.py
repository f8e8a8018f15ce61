"""The machine report (course_lib.runtime.machine)."""

from course_lib.runtime.machine import describe_machine, format_machine


def test_describe_machine_reports_cores_gpus_and_backends():
    info = describe_machine()
    assert info["usable_cores"] >= 1 and info["backends"]["gloo"] is True
    assert info["launch_backend_for_2"] in ("gloo", "cpu:gloo,cuda:nccl")
    assert info["launch_backend_for_1"] in ("gloo", "cpu:gloo,cuda:nccl")
    text = format_machine(info)
    assert "gloo yes" in text and "CPU cores" in text and "GPUs:" in text
