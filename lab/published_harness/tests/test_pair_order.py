"""The pair-order page: each side's first-in-pair cost, and the seed's orders against random ones."""

import pytest

from published_harness import pair_order
from published_harness.tests.test_compare import write


def result(penalty: float, retimed: int = 0) -> dict:
    """A result whose calls take 1 ms (reference) and 0.5 ms (custom), ``1 + penalty`` times that
    when first in their pair, in the orders seed 42 draws for 7 trials of 10 pairs."""
    drawn = pair_order.orders(42, 7, 10)
    ref = [[1.0 * (1 + penalty if first else 1) for first in row] for row in drawn]
    cus = [[0.5 * (1 if first else 1 + penalty) for first in row] for row in drawn]
    trials = [sum(r) / sum(c) for r, c in zip(ref, cus, strict=True)]
    return {"status": "ok", "score": sum(trials) / 7, "ref_ms": ref, "custom_ms": cus, "trial_scores": trials,
            "params": {"seed": 42}, "host_timing": {"retimed_pairs": retimed}}


def test_the_seed_draws_the_same_orders_and_a_first_call_penalty_follows_them():
    assert [sum(row) for row in pair_order.orders(42, 7, 10)] == [6, 5, 5, 1, 8, 6, 4]
    e = pair_order.order_effect(result(0.7))
    assert e["first_second"] == {"ref": pytest.approx(0.7), "custom": pytest.approx(0.7)}
    assert (e["lowest"], e["highest"]) == (4, 5)  # 1 and 8 reference-first pairs of 10
    # balanced overall (35 of 70): the fixed orders score within 1 % of random orders' expectation,
    # while one run with random orders swings by several per cent
    assert 0 < e["fixed_vs_random"] < 0.01 and 0.04 < e["random_sd"] < 0.08
    flat = pair_order.order_effect(result(0.0))
    assert flat["fixed_vs_random"] == pytest.approx(0) and flat["random_sd"] == pytest.approx(0)


def test_results_with_re_timed_pairs_are_left_out_unless_they_record_their_orders(tmp_path):
    assert pair_order.order_effect(result(0.5, retimed=1)) is None
    recorded = result(0.5, retimed=1)
    recorded["host_timing"]["ref_first"] = pair_order.orders(42, 7, 10)
    assert pair_order.order_effect(recorded)["first_second"]["ref"] == pytest.approx(0.5)
    write(tmp_path / "wf", "L1_T026", result(0.5))
    write(tmp_path / "wf", "L1_T082", result(0.5, retimed=2))
    text = pair_order.render([tmp_path / "wf"], "default")
    assert "[6, 5, 5, 1, 8, 6, 4]" in text and "| wf | L1_T026 | +50% | +50% | 4 / 5 |" in text
    assert "L1_T082" not in text


class QuietClock:
    """A thread clock under which no call is disturbed (no pair is re-timed)."""

    def sample(self):
        return 0

    def delta(self, before, after):
        from l1bench.timing import hostclock

        return hostclock.Delta(30_000, 29_000, 0, 0, 0)


def test_the_orders_are_the_ones_the_paper_protocol_times_in():
    """The page rebuilds the orders; the product's timed pairs, one rng over the trials (as the
    worker passes it), must call the models in them, or the page reads the wrong sides."""
    import random

    from l1bench.timing import harness, hostclock

    calls, rng, ledger = [], random.Random(42), hostclock.Ledger()
    for trial in range(7):
        harness.timed_pairs(lambda *x: calls.append("ref"), lambda *x: calls.append("custom"), lambda: (), 10,
                            rng, "cpu", [], ledger, trial, QuietClock())
    firsts = [calls[i] == "ref" for i in range(0, len(calls), 2)]
    assert firsts == [first for row in pair_order.orders(42, 7, 10) for first in row]


def test_a_runs_offset_is_taken_out_of_its_score_from_its_own_orders(tmp_path):
    """The workflow's orders are rebuilt from its seed; the published harness's are read from the
    ``trial`` events ``child.py`` recorded. A run whose orders favour the reference (8 of 10 pairs
    reference-first in every trial) scores high; its corrected score is the balanced one."""
    import json

    wf = result(0.7)
    write(tmp_path / "wf", "L1_T026", wf)
    write(tmp_path / "wf", "L1_T082", result(0.7, retimed=1))
    pub_orders = [[True] * 8 + [False] * 2 for _ in range(7)]
    ref = [[1.0 * (1.7 if first else 1) for first in row] for row in pub_orders]
    cus = [[0.5 * (1 if first else 1.7) for first in row] for row in pub_orders]
    trials = [sum(r) / sum(c) for r, c in zip(ref, cus, strict=True)]
    write(tmp_path / "pub", "L1_T026", {"status": "ok", "score": sum(trials) / 7, "harness": "published"})
    events = tmp_path / "pub" / "h100" / "harness_logs" / "default" / "L1_T026" / "events.jsonl"
    events.parent.mkdir(parents=True)
    events.write_text("\n".join(json.dumps({"event": "trial", "index": i, "score": s, "ref_ms": r, "custom_ms": c,
                                            "ref_first": o})
                                for i, (s, r, c, o) in enumerate(zip(trials, ref, cus, pub_orders, strict=True))))
    balanced = 2.0  # 1 ms against 0.5 ms, with the same first-call cost on both sides
    pub = pair_order.corrected_pass(tmp_path / "pub", "default")["L1_T026"]
    assert sum(trials) / 7 > 1.2 * balanced  # the orders moved the measured score
    e = pair_order.run_effect(tmp_path / "pub" / "h100", "default", "L1_T026")
    assert e["ref_first"] == [8] * 7 and e["fixed_vs_random"] > 0.2
    wf_corrected = pair_order.corrected_pass(tmp_path / "wf", "default")
    assert wf_corrected["L1_T026"]["score"] < wf["score"] and "ORDER_UNKNOWN" in wf_corrected["L1_T082"]["flags"]
    # both corrected scores sit at random orders' expectation: the same for the same calls
    assert pub["score"] == pytest.approx(wf_corrected["L1_T026"]["score"], rel=1e-9)
