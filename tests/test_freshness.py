"""The tables' record: a digest of what they were made from (l1bench.freshness)."""

from pathlib import Path

from l1bench import freshness

PARAMS = {"device": "demo", "ceiling": 10}


def test_the_record_is_the_digest_of_the_inputs_contents_and_parameters(tmp_path):
    res = tmp_path / "results/demo"
    inputs = [res / "check/L1_T001.json", res / "time/paper/default/L1_T001.json"]
    for i, p in enumerate(inputs):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f'{{"status": "ok", "n": {i}}}')
    sha = freshness.write_record(res / freshness.RECORD, res, inputs, PARAMS)
    assert '"sha256": "' + sha in (res / freshness.RECORD).read_text()
    # contents given in memory (a meta.json not yet split) digest as the same files on disk
    contents = [(str(p), Path(p).read_bytes()) for p in reversed(inputs)]
    assert freshness.digest_contents(res, contents, PARAMS) == sha
    assert freshness.digest(res, inputs, PARAMS | {"ceiling": 20}) != sha
    assert freshness.digest(res, inputs[:1], PARAMS) != sha
    inputs[0].write_text('{"status": "ok", "n": 9}')
    assert freshness.digest(res, inputs, PARAMS) != sha
