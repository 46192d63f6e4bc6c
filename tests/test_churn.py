"""The churn bench: its oracle and hindsight cap on a hand-checked trace, and a short real run.

The tiny trace (sizes in MiB: a ``build`` session 15, a ``ramp`` one 20, the baseline 5,
a 50 MiB limit, so the high watermark is at 40), worked by hand:

    #  t   kind   ends  oracle (used + size <= 40)        cap 2 (live < 2)
    0  0   ramp   10    5 + 20 = 25: admit                admit (25)
    1  1   ramp   11    25 + 20 = 45: refuse              admit (45)
    2  2   build   3    25 + 15 = 40: admit (at the line) 2 live: refuse
    3  4   build  14    #2 ended: 25 + 15 = 40: admit     refuse
    4  10  build  15    #0 ended: 20 + 15 = 35: admit     #0 ended: admit (40)
    5  12  ramp   20    35 + 20 = 55: refuse              #1 ended: admit (40)

A cap of 1 admits #0 and #4; a cap of 3 admits #0, #1 and #2 at once, 60 MiB, over the
limit: the hindsight cap is 2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kits.suitekit import MIB

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import churn_trace
from churn_trace import Arrival, Trace

BENCH = Path(churn_trace.__file__).parent

SIZES: dict[churn_trace.Kind, int] = {"build": 15 * MIB, "ramp": 20 * MIB}
BASELINE = 5 * MIB
LIMIT = 50 * MIB
TINY = Trace(
    arrivals=(
        Arrival(t=0, kind="ramp", lifetime_s=10),
        Arrival(t=1, kind="ramp", lifetime_s=10),
        Arrival(t=2, kind="build", lifetime_s=1),
        Arrival(t=4, kind="build", lifetime_s=10),
        Arrival(t=10, kind="build", lifetime_s=5),
        Arrival(t=12, kind="ramp", lifetime_s=100),
    ),
    window_s=20,
    rate_per_s=0.3,
    mean_lifetime_s=10,
    load=1.5,
    seed=None,
)


def test_the_oracle_admits_up_to_the_high_watermark_and_no_further() -> None:
    """The clairvoyant admitter takes a session that lands exactly on the watermark and
    refuses one that would pass it, freeing sessions that ended at or before an arrival."""
    run = churn_trace.oracle(TINY, sizes=SIZES, baseline=BASELINE, limit=LIMIT)
    assert run.admitted == (0, 2, 3, 4)
    assert run.served == 4
    assert run.peak_bytes == 40 * MIB


@pytest.mark.parametrize(
    ("cap", "admitted", "peak_mb"),
    [(0, (), 5), (1, (0, 4), 25), (2, (0, 1, 4, 5), 45), (3, (0, 1, 2, 3, 4, 5), 60)],
)
def test_a_count_cap_admits_while_fewer_than_the_cap_are_live(
    cap: int, admitted: tuple[int, ...], peak_mb: int
) -> None:
    """A count cap ignores sizes: it admits while fewer than ``cap`` sessions are live."""
    run = churn_trace.count_cap(TINY, sizes=SIZES, baseline=BASELINE, cap=cap)
    assert (run.admitted, run.peak_bytes) == (admitted, peak_mb * MIB)


def test_the_hindsight_cap_serves_most_without_passing_the_limit() -> None:
    """Of the caps whose sessions never exceed the limit on the trace, the one serving
    most is chosen; held to the watermark instead, only a cap of 1 keeps under it."""
    choice = churn_trace.hindsight_cap(TINY, sizes=SIZES, baseline=BASELINE, limit=LIMIT)
    assert (choice.cap, choice.replay.served, choice.replay.peak_bytes) == (2, 4, 45 * MIB)
    under = churn_trace.hindsight_cap(TINY, sizes=SIZES, baseline=BASELINE, limit=40 * MIB)
    assert (under.cap, under.replay.served) == (1, 2)


def test_a_session_ends_at_its_lifetime_or_at_the_window() -> None:
    """A lifetime running past the window is cut at the window's end."""
    assert TINY.arrivals[0].end(TINY.window_s) == 10
    assert TINY.arrivals[5].end(TINY.window_s) == 20


def test_a_seed_fixes_the_trace_and_the_rate_offers_the_load() -> None:
    """One seed draws one trace, which survives its JSON; the arrival rate times the mean
    lifetime is the load times what fits, and both kinds arrive."""
    trace = churn_trace.make_trace(minutes=1, load=1.5, seed=7)
    assert trace == churn_trace.make_trace(minutes=1, load=1.5, seed=7)
    assert trace != churn_trace.make_trace(minutes=1, load=1.5, seed=8)
    assert Trace.from_json(json.loads(json.dumps(trace.to_json()))) == trace
    fits = churn_trace.sessions_that_fit()
    assert 7.9 < fits < 8.0  # (614.4 - 40) / 72 MiB
    assert trace.rate_per_s * trace.mean_lifetime_s == pytest.approx(1.5 * fits, rel=1e-3)
    assert all(0 < a.t < 60 for a in trace.arrivals)
    assert {a.kind for a in trace.arrivals} == {"build", "ramp"}


def test_a_malformed_trace_is_refused_naming_its_file(tmp_path: Path) -> None:
    """A trace file with a kind the bench does not know, or arrivals out of order, is
    refused with an error naming the file."""
    good = TINY.to_json()
    for arrivals in (
        [{"t": 0, "kind": "video", "lifetime_s": 1}],
        [{"t": 2, "kind": "ramp", "lifetime_s": 1}, {"t": 1, "kind": "ramp", "lifetime_s": 1}],
    ):
        path = tmp_path / "trace.json"
        path.write_text(json.dumps({**good, "arrivals": arrivals}))
        with pytest.raises(ValueError, match=r"trace\.json is not a churn trace"):
            Trace.load_file(path)


@pytest.mark.real_cgroup
@pytest.mark.real_server
@pytest.mark.slow
@pytest.mark.timeout(210)
def test_a_short_churn_run_reports_every_mode_and_the_guard_is_never_oom_killed(
    tmp_path: Path,
) -> None:
    """Nine seconds of churn in real 768 MiB memory groups: a row for the bare app, the
    hindsight cap, the guard, the learning guard, the guard with a 10 s wait and the guard
    not told the sessions' own memory, every arrival accounted for once, no OOM kill in
    any guard's group, and no admitted session of the waiting guard waiting longer than
    its wait (plus its request)."""
    out = tmp_path / "churn.json"
    subprocess.run(
        [
            sys.executable,
            str(BENCH / "churn.py"),
            "--minutes",
            "0.15",
            "--modes",
            "bare,cap,guard,learn,wait,unmeasured",
            "--json",
            str(out),
        ],
        check=True,
        env={**os.environ, "PYTHONPATH": str(BENCH)},
        timeout=200,
    )
    figures = json.loads(out.read_text())
    rows = {str(row["mode"]).split()[0]: row for row in figures["runs"]}
    assert list(rows) == ["bare", "cap", "guard", "learn", "wait", "unmeasured"]
    assert rows["cap"]["mode"] == f"cap {figures['hindsight_cap']}"
    for row in rows.values():
        outcomes = row["served"] + row["refused"] + row["lost"] + row["failed"]
        assert outcomes == figures["arrivals"], row
    for mode in ("guard", "learn", "wait", "unmeasured"):
        assert rows[mode]["oom_kills"] == 0, rows[mode]
        assert rows[mode]["server_alive"], rows[mode]
        assert rows[mode]["served"] > 0, rows[mode]
    assert 0 < figures["oracle_served"] <= figures["arrivals"]
    waited = rows["wait"]["waited_s"]
    assert 0 <= waited["median"] <= waited["p90"] <= waited["max"] < 10 + 5, waited
    assert set(rows["wait"]["refused_by_reason"]) <= {"queue_timeout", "queue_full"}, rows["wait"]
