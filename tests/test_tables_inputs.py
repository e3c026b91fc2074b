"""The tables' record: a digest of what they were made from (l1bench.tables_inputs)."""

from pathlib import Path

from l1bench import tables_inputs

PARAMS = {"device": "demo", "ceiling": 10}


def test_the_record_is_the_digest_of_the_inputs_contents_and_parameters(tmp_path):
    res = tmp_path / "results/demo"
    inputs = [res / "check/L1_T001.json", res / "time/paper/default/L1_T001.json"]
    for i, p in enumerate(inputs):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f'{{"status": "ok", "n": {i}}}')
    sha = tables_inputs.write_record(res / tables_inputs.RECORD, res, inputs, PARAMS)
    assert '"sha256": "' + sha in (res / tables_inputs.RECORD).read_text()
    # contents given in memory (a meta.json not yet split) digest as the same files on disk
    contents = [(str(p), Path(p).read_bytes()) for p in reversed(inputs)]
    assert tables_inputs.digest_contents(res, contents, PARAMS) == sha
    assert tables_inputs.digest(res, inputs, PARAMS | {"ceiling": 20}) != sha
    assert tables_inputs.digest(res, inputs[:1], PARAMS) != sha
    inputs[0].write_text('{"status": "ok", "n": 9}')
    assert tables_inputs.digest(res, inputs, PARAMS) != sha
