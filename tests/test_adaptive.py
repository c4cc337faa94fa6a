"""A risk threshold adapted online (routers.adaptive) and its replay over held-out
requests (routers.scoring.adaptive): the stream's violation rate stays within the
tracker's bound of the target on any sequence, a certificate broken by a shifted
family is repaired by the feedback, and the wrapper decides as its router does."""

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator

from modeswitch.routers.adaptive import AdaptiveThresholdRouter, ThresholdTracker
from modeswitch.routers.scoring.adaptive import adaptive_replay, replay_stream, violation_matrix
from modeswitch.routers.scoring.offline import score_requests
from modeswitch.routers.scoring.threshold_sweep import picks_at
from tests.test_cost_routers import REF
from tests.test_group_certificates import family_rates, shifted_table
from tests.test_threshold_sweep import TARGET, certified, held_out


def test_on_the_worst_sequence_the_rate_exceeds_the_target_by_at_most_the_bound():
    """An adversary makes every pick off the strictest end violate (at the strictest end
    the reference answers, which never does): the rate still meets ``target + slack``,
    and it sits near the target, not at 0 or 1."""
    for target, step in ((0.02, 0.1), (0.05, 0.02), (0.2, 0.5)):
        t = ThresholdTracker(start=0.3, strictest=-1.0, loosest=0.5, target=target, step_size=step)
        for _ in range(5000):
            t.update(t.threshold > t.strictest)
        assert t.rate <= target + t.slack() + 1e-12
        assert abs(t.rate - target) < 0.01
    assert t.slack(0) == float("inf") and t.slack(100) == pytest.approx((1.5 + 0.75) / (0.75 * 100))


def test_the_threshold_walks_to_the_strictest_end_on_violations_and_to_the_loosest_without():
    t = ThresholdTracker(start=0.0, strictest=-1.0, loosest=0.5, target=0.02, step_size=0.1)
    for _ in range(20):
        t.update(True)
    assert t.threshold == -1.0 and t.position < 0  # below the strict end: held, not clipped
    for _ in range(2000):
        t.update(False)
    assert t.threshold == 0.5 and t.rate == pytest.approx(20 / 2020)
    down = ThresholdTracker(start=0.9, strictest=1.0, loosest=0.0, target=0.1)  # a P(safe) threshold: loose is low
    looser = down.update(False)
    assert looser < 0.9 and down.update(True) > looser
    with pytest.raises(ValueError, match="target violation rate"):
        ThresholdTracker(0.0, -1.0, 0.5, target=0.0)
    with pytest.raises(ValueError, match="coincide"):
        ThresholdTracker(0.0, 0.5, 0.5)


def test_feedback_repairs_a_certificate_that_a_shifted_family_breaks():
    """Certified on plain families, served to a family whose quantised mode fails from
    150 prompt tokens on (not 450): the fixed threshold breaks its target there, the
    adapted one holds the stream within the bound and keeps a saving."""
    train = shifted_table(150, seed=3, shifted=(), plain=("a", "b"))
    r = certified(train)
    test = held_out(21, shifted=("c",), plain=())
    fixed_rate = float(family_rates(r, test).max())
    assert fixed_rate > 2 * TARGET  # the shift breaks the certificate
    picks, at, tracker = replay_stream(r, test, violation_matrix(test, list(r.router_.modes_)),
                                       np.random.default_rng(0).permutation(len(test)), TARGET)
    scored = score_requests(test, picks)
    rate = float(scored["violates_any"].mean())
    assert rate == pytest.approx(tracker.rate) and rate <= TARGET + tracker.slack()
    assert rate < fixed_rate and tracker.threshold < r.threshold_  # tightened
    assert (scored["pick"] != REF).any()  # not everything handed back to the reference
    assert np.isfinite(at).all()


def test_the_replay_reports_each_certified_router_beside_its_certified_threshold():
    train = shifted_table(150, seed=3, shifted=(), plain=("a", "b"))
    test = held_out(21, shifted=("c",), plain=("a",))
    r = certified(train)
    summary, per_family = adaptive_replay({"cost": r, "rule": object()}, test)
    row = summary.set_index("router").loc["cost"]
    assert list(summary["router"]) == ["cost"] and row["requests"] == len(test)
    fixed = score_requests(test, picks_at(r, test, [r.threshold_])[0])  # the ensemble at its threshold
    assert row["certified_violations"] == pytest.approx(fixed["violates_any"].mean())
    assert row["violations"] < row["certified_violations"]
    assert set(per_family["family"]) == {"a", "c"}
    assert row["worst_family_violations"] == pytest.approx(per_family["violations"].max())
    assert row["stream_requests"] == len(test) and row["stream_violations"] <= TARGET + row["slack"]
    delayed = adaptive_replay({"cost": r}, test, delay=25)[0].iloc[0]
    assert delayed["delay"] == 25 and delayed["slack"] > row["slack"]  # a delay widens the bound
    assert delayed["stream_violations"] <= TARGET + delayed["slack"]


def test_the_wrapper_decides_as_its_router_and_tightens_on_violations():
    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    test = held_out(7)
    before = np.asarray(r.predict(test), dtype=object)
    a = AdaptiveThresholdRouter(FrozenEstimator(r), target_violation_rate=TARGET).fit(test)
    assert a.threshold_ == pytest.approx(r.threshold_)
    same = np.asarray(r.router_.predict(test), dtype=object)  # the ensemble at the certified threshold
    assert (np.asarray(a.predict(test), dtype=object) == same).all()
    for _ in range(40):
        a.observe(True)
    assert (np.asarray(a.predict(test), dtype=object) == REF).all()
    assert (np.asarray(r.predict(test), dtype=object) == before).all()  # the router given is untouched
    state = a.state()
    assert state["observed"] == 40 and state["rate"] == 1.0 and state["threshold"] < state["start_threshold"]
    assert clone(a).get_params()["target_violation_rate"] == TARGET
    assert "adapted online" in a.explain(test.iloc[:1])[0][1]
    a.observe([False] * 3)
    assert a.state()["observed"] == 43


def test_the_report_writes_the_replay_and_marks_it_in_the_frontier_plot(tmp_path):
    from types import SimpleNamespace

    import pandas as pd

    from modeswitch.routers.scoring import report
    from modeswitch.routers.scoring.offline import aggregate_scores
    from modeswitch.routers.scoring.overhead import Overhead

    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    test = held_out(21, shifted=("c",), plain=("a",))
    summary, per_family = adaptive_replay({"cost": r}, test)
    per = score_requests(test, np.asarray(r.predict(test), dtype=object), router="cost")
    per_family_scores, overall = aggregate_scores(per)
    curve = pd.DataFrame({"violations": [0.0, 0.1], "capture": [0.0, 1.0]})
    files = report.write_report(tmp_path / "r", per_request=per, per_family=per_family_scores, overall=overall,
                                overhead={"cost": Overhead("cost", "compiled", 10, 1.0, 1.0, 1.0, None)},
                                context={"name": "t"}, adaptive=summary, adaptive_family=per_family,
                                frontier=SimpleNamespace(curve=curve, split="group", scored=len(test)))
    assert {tmp_path / "r" / "adaptive_replay.csv", tmp_path / "r" / "adaptive_replay_per_family.csv",
            tmp_path / "r" / "plots" / "capture_vs_violations.png"} <= set(files)
    md = (tmp_path / "r" / "README.md").read_text()
    row = summary.iloc[0]
    assert "## Adapted online" in md and \
        f"cost: adapted {row['capture']:.1%} of the oracle's saving at {row['violations']:.1%}" in md
    assert len(pd.read_csv(tmp_path / "r" / "adaptive_replay_per_family.csv")) == len(per_family)


def test_the_compiled_form_follows_the_threshold_off_the_serving_path():
    """Compiled, the adapted router decides as its pipeline does; outcomes move the
    threshold and a build at the new one is swapped in (the reference only, after a run
    of violations); pickled (as MLflow stores it), the compiled form is left behind."""
    import pickle

    from modeswitch.routers.scoring.offline import requests_from_table

    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    test = held_out(7)
    reqs = requests_from_table(test)
    a = AdaptiveThresholdRouter(FrozenEstimator(r), target_violation_rate=TARGET).fit(test)
    fast = a.compile()
    assert fast is a.compile() and fast.distilled_ is None  # one compiled form per wrapper
    assert [fast.route(q) for q in reqs] == [a.route(q) for q in reqs]
    assert any(m != REF for m in (fast.route(q) for q in reqs))
    small = a.observe([True])  # one step, eta * (1 - target): 9.5 % of the range, past recompile_step's 1 %
    assert fast.wait() and fast.threshold == pytest.approx(small) and fast.builds == 2
    fast.observe([True] * 40)  # the compiled form takes feedback as the wrapper does
    assert fast.wait() and fast.threshold == pytest.approx(a.threshold_) and a.threshold_ == a.tracker_.strictest < 0
    assert all(fast.route(q) == REF for q in reqs)
    assert a.state()["recompiles"] == fast.builds - 1 >= 2 and a.state()["observed"] == 41
    back = pickle.loads(pickle.dumps(a))
    assert "_compiled" not in back.__dict__ and back.threshold_ == a.threshold_
    assert [back.compile().route(q) for q in reqs[:20]] == [REF] * 20


def test_small_moves_do_not_rebuild():
    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    test = held_out(7)
    a = AdaptiveThresholdRouter(FrozenEstimator(r), target_violation_rate=TARGET, recompile_step=0.5).fit(test)
    fast = a.compile()
    a.observe([False] * 10)  # 10 x eta x target: 10 x 0.1 x 0.05 = 5 % of the range, under 50 %
    assert fast.wait() and fast.builds == 1 and fast.threshold == a.start_threshold_ != a.threshold_


def test_the_exported_router_takes_feedback_for_the_router_it_holds():
    """MLflow's pyfunc wrapper (what ``modeswitch serve`` loads) routes compiled and passes
    ``observe`` / ``state`` on, so the server's /admin/feedback reaches the tracker."""
    from modeswitch.routers.export import RouterPyfunc
    from modeswitch.routers.scoring.offline import requests_from_table

    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    test = held_out(7)
    model = RouterPyfunc()
    model.router_ = AdaptiveThresholdRouter(FrozenEstimator(r), target_violation_rate=TARGET).fit(test)
    model.use_compiled(True)
    assert model.path_ == "compiled"
    model.observe([True] * 40)
    assert model.state()["observed"] == 40 and model.router_.compile().wait()
    assert {model.route(q) for q in requests_from_table(test)} == {REF}
    plain = RouterPyfunc()
    plain.router_ = r
    assert not hasattr(plain.use_compiled(True), "observe")


def test_the_study_report_sets_each_splits_replay_beside_its_certificate(tmp_path):
    from modeswitch.study.report import _adaptive_lines

    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    summary, _ = adaptive_replay({"cost": r}, held_out(21, shifted=("c",), plain=("a",)))
    (tmp_path / "group").mkdir()
    summary.to_csv(tmp_path / "group" / "adaptive_replay.csv", index=False)
    (tmp_path / "lofo").mkdir()  # a split report without a replay: no line
    lines = _adaptive_lines({"group": tmp_path / "group", "lofo": tmp_path / "lofo"})
    row = summary.iloc[0]
    assert lines[0].startswith("## Thresholds adapted online") and len(lines) == 4
    assert lines[2] == (f"- group, cost: adapted {row['capture']:.1%} of the oracle's saving at "
                        f"{row['violations']:.1%} violations (worst family {row['worst_family_violations']:.1%}; "
                        f"certified {row['certified_capture']:.1%} at {row['certified_violations']:.1%}); every "
                        f"decision of the streams {row['stream_violations']:.1%} of {row['stream_requests']}, worst stream "
                        f"{row['worst_stream_violations']:.1%} (bound: target 5% + slack {row['slack']:.1%})")
    assert _adaptive_lines({"lofo": tmp_path / "lofo"}) == []


def test_only_a_router_that_answers_the_reference_below_a_threshold_is_adapted():
    """A mode classifier's strictest threshold is infinite and answers its fallback: no
    bound, refused by name; non-finite ends are refused by the tracker; a cost router's
    strict end is just below 0 (its risk scores are never negative), not -1."""
    from modeswitch.routers.adaptive import tracker_for
    from modeswitch.routers.registry import get_router

    with pytest.raises(ValueError, match="cannot adapt its threshold online"):
        tracker_for(get_router("lgbm", safety_threshold=0.7), 0.8, 0.02, 0.1)
    with pytest.raises(ValueError, match="must be finite"):
        ThresholdTracker(0.7, float("inf"), 0.5)
    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    t = tracker_for(r.router_, None, 0.02, 0.1)
    assert t.threshold < 0 and t.threshold > -1e-300 and t.width == pytest.approx(r.router_.loosest_threshold())
    r.router_.set_risk_threshold(t.threshold)
    test = held_out(7)
    assert set(np.asarray(r.router_.predict(test), dtype=object)) == {REF}  # the strict end answers the reference
    r.router_.set_risk_threshold(r.threshold_)


def test_the_compiled_form_reaches_the_strict_end_however_small_the_lag():
    """With a rebuild step wider than the distance left, a tracker that reaches the strict
    end still has it built: there the reference answers and the bound holds."""
    from modeswitch.routers.scoring.offline import requests_from_table

    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    test = held_out(7)
    a = AdaptiveThresholdRouter(FrozenEstimator(r), target_violation_rate=TARGET, step_size=0.01,
                                recompile_step=0.9).fit(test)
    fast = a.compile()
    while a.tracker_.position > 0:
        a.observe(True)
    assert fast.wait() and fast.threshold == a.threshold_ == a.tracker_.strictest
    assert {fast.route(q) for q in requests_from_table(test)} == {REF}


def test_an_adapted_router_exports_and_loads_with_its_tracker(tmp_path):
    from modeswitch.routers.export import export_router, load_router
    from modeswitch.routers.scoring.offline import requests_from_table

    r = certified(shifted_table(150, seed=3, shifted=(), plain=("a", "b")))
    test = held_out(7)
    a = AdaptiveThresholdRouter(FrozenEstimator(r), target_violation_rate=TARGET).fit(test)
    a.observe([False] * 7)
    mlruns = str(tmp_path / "mlruns")
    info = export_router(a, mlruns=mlruns, source_run_id="r1", backend="transformers")
    loaded = load_router(info["uri"], mlruns)
    reqs = requests_from_table(test)
    assert loaded.path_ == "compiled" and loaded.state()["observed"] == 7
    assert loaded.state()["threshold"] == pytest.approx(a.threshold_)
    assert [loaded.route(q) for q in reqs] == [a.compile().route(q) for q in reqs]
