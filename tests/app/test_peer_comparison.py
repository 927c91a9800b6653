"""benchmarks/peer_comparison.py's report: the time to the threshold, the ratio between the frameworks, and where
lightrl's time went, read from each run's evaluations and throughput report."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers import ROOT

spec = importlib.util.spec_from_file_location("peer_comparison", ROOT / "benchmarks" / "peer_comparison.py")
peers = sys.modules["peer_comparison"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
spec.loader.exec_module(peers)


def curve(*points: tuple[int, float, float]) -> list[dict[str, float]]:
    return [{"frames": frames, "seconds": seconds, "return": value} for frames, seconds, value in points]


def test_the_report_gives_each_frameworks_time_to_the_threshold_their_ratio_and_lightrls_phases():
    phases = {"collect": 0.3, "update": 0.6, "eval": 0.1, "checkpoint": 0.001}
    results = {
        "tasks": {
            "cartpole_ppo": {
                "lightrl": [
                    {
                        "curve": curve((5000, 10.0, 200.0), (10000, 20.0, 480.0)),
                        "phases": phases,
                        "update_vs_bare": 1.5,
                    },
                    {"curve": curve((5000, 12.0, 490.0)), "phases": phases, "update_vs_bare": 1.7},
                ],
                "sb3": [
                    {"curve": curve((5000, 30.0, 100.0), (10000, 60.0, 476.0))},
                    {"curve": curve((5000, 30.0, 300.0), (10000, 60.0, 400.0))},  # never reaches 475
                ],
            }
        }
    }
    report = peers.summarise(results)
    lightrl, sb3 = (line for line in report.splitlines() if line.startswith("| CartPole-v1"))
    # lightrl: both seeds reached 475, at 20 s and 12 s (median 16 s), at 10,000 and 5,000 frames.
    assert "| lightrl | 2/2 | 16 (12–20) | 7,500 (5,000–10,000) |" in lightrl
    assert "| sb3 | 1/2 | 60 |" in sb3 and "500.0 ± 0.0 at 100k" in sb3
    # A ratio needs every seed of both to reach the threshold: SB3's second did not, so there is none.
    assert "× SB3's" not in report
    assert "collect 30 %, update 60 %, eval 10 %; its update step took 1.60× its bare arithmetic" in report
    assert "checkpoint" not in report  # under half a percent: left out

    results["tasks"]["cartpole_ppo"]["sb3"][1]["curve"].append({"frames": 15000, "seconds": 90.0, "return": 500.0})
    assert "lightrl's median time to 475 is 0.21× SB3's (16 s against 75 s)." in peers.summarise(results)
