"""benchmarks/racing_generalisation.py: the held-out and stress circuits driven both ways, summaries per set, and a
candidate judged against its baseline circuit by circuit."""

from __future__ import annotations

import json

import pytest

from benchmarks.racing_generalisation import judge, judge_pairs, main, markdown
from envs.racing.stress_circuits import STRESS_CIRCUITS


def rows(names: list[str], completed: tuple[float, ...], times: tuple[float | None, ...]) -> list[dict]:
    return [
        {"circuit": name, "first_lap_completed": share, "first_lap_time_s": time}
        for name, share, time in zip(names, completed, times, strict=True)
    ]


def test_a_candidate_misses_a_circuit_only_where_its_baseline_drives_it():
    names = ["held-out 0", "held-out 0 reversed", "stress paperclip", "stress paperclip reversed", "reference"]
    baseline = rows(names, (1.0, 1.0, 0.5, 1.0, 1.0), (20.0, 20.0, 30.0, 30.0, 25.0))
    candidate = rows(names, (1.0, 0.9, 0.0, 1.0, 0.0), (19.0, 18.0, None, 27.0, None))
    verdict = judge(baseline, candidate, completion=0.95)
    # The baseline's 50 % stress circuit does not count against the candidate; its reference circuit is not judged.
    assert verdict["missed"] == ["held-out 0 reversed"] and verdict["passes"] is False
    assert verdict["faster"]["held_out"] == pytest.approx(1 - (19 / 20 + 18 / 20) / 2)
    assert verdict["faster"]["stress"] == pytest.approx(1 - 27 / 30)  # only where both completed a first lap
    policies = {"bc": {"circuits": baseline}, "sac": {"circuits": candidate}}
    policies |= {"bc1": {"circuits": baseline}, "sac1": {"circuits": baseline}}
    pairs = judge_pairs(policies, ["bc", "sac", "bc1", "sac1"], completion=0.95)
    assert [pair["passes"] for pair in pairs["pairs"]] == [False, True] and pairs["passes"] is False
    assert pairs["faster"]["stress"]["faster_mean"] == pytest.approx((1 - 27 / 30 + 0.0) / 2)


@pytest.mark.slow
def test_the_report_drives_every_set_both_ways_and_pairs_need_an_even_count(tmp_path, capsys):
    files = ["--json", str(tmp_path / "g.json"), "--markdown", str(tmp_path / "g.md")]
    report = main(["--starts", "1", "--seconds", "4", "--ceiling", *files])
    circuits = [row["circuit"] for row in report["policies"]["expert"]["circuits"]]
    stress = [f"stress {name}{way}" for name in STRESS_CIRCUITS for way in ("", " reversed")]
    assert [c for c in circuits if c.startswith("stress")] == stress
    assert len([c for c in circuits if c.startswith("held-out")]) == 16 and "reference reversed" in circuits
    summary = report["policies"]["expert"]["summary"]
    assert set(summary) == {
        "held_out",
        "stress",
    }  # (4 s: no first lap yet; the expert's are tests/envs/test_circuits.py's)
    assert summary["stress"]["first_lap_completed"] == 0.0 and summary["stress"]["first_lap_time_s"] is None
    assert json.loads((tmp_path / "g.json").read_text())["policies"]["expert"]["summary"] == summary
    assert "- stress circuits: 0 % of first laps completed, mean first lap —" in (tmp_path / "g.md").read_text()
    # The floored throttle beside the expert, judged against it (4 s: no first laps to compare, nothing missed).
    assert report["ceiling"]["pairs"][0]["baseline"] == "expert" and report["ceiling"]["pairs"][0]["missed"] == []
    assert "### Ceiling: the expert's steering with the throttle floored" in (tmp_path / "g.md").read_text()
    # The default config (configs/racing_bc_circuits.yaml) drives a car with a speed limiter; on one without, the
    # floored throttle measures something else, and the report says which.
    assert report["ceiling"]["speed_limiter"] == {"braking": 6.0}
    assert "The car has a speed limiter: this is the fastest lap" in (tmp_path / "g.md").read_text()
    without = {**report, "ceiling": {**report["ceiling"], "speed_limiter": None}}
    assert "The car has no speed limiter: this is what arriving at corners unbraked costs." in markdown(without)
    with pytest.raises(SystemExit):
        main(["--pairs", "--checkpoints", str(tmp_path / "g.json")])
    assert "--pairs needs an even number of --checkpoints" in capsys.readouterr().err
