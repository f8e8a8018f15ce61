"""The lessons 3-4 benchmark runs and reports (it asserts nothing about speed)."""

from course_lib import dp_benchmark


def test_benchmark_prints_the_ring_ratio_and_the_ddp_speedup(capsys):
    bw, times = dp_benchmark.main(["--repeats", "1", "--steps", "2"])
    out = capsys.readouterr().out
    assert "ratio ring / gloo" in out and "speedup" in out
    assert set(bw) == {"gloo", "efficient ring"} and all(v > 0 for v in bw.values())
    assert set(times) == {1, 2} and all(len(t) == 2 for t in times.values())
