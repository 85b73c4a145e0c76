"""A worker's periodic stats line: rates over the interval, silent while idle."""

from services.worker.stats_log import Totals, stats_line


def test_the_line_gives_the_intervals_rates_and_cache_use() -> None:
    line = stats_line(Totals(0.0, 100, 0, 10), Totals(10.0, 1100, 1000, 510), running=3, waiting=1, used=50,
                      blocks=200)
    assert line == ("running 3, waiting 1; prompt 200.0 tok/s (100.0 computed), generation 50.0 tok/s; "
                    "KV 25.0% used (50/200 blocks); prefix hits 50.0%")


def test_an_idle_interval_says_nothing() -> None:
    assert stats_line(Totals(0.0, 5, 5, 5), Totals(10.0, 5, 5, 5), running=0, waiting=0, used=0, blocks=64) is None
    assert "prefix hits -" in (stats_line(Totals(0.0, 5, 5, 5), Totals(10.0, 5, 5, 9), 1, 0, 1, 64) or "")
