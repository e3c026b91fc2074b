"""Command-line config values typed by the schema (l1bench.cliconfig), and one line for a bad one."""

import subprocess

import pytest
from helpers import ROOT, SNAKEMAKE

from l1bench import cliconfig
from l1bench.preflight import config_error

SCHEMA = ROOT / "config/schemas/config.schema.yaml"


def normalised(**cfg):
    cliconfig.normalise(cfg, SCHEMA)
    return cfg


# What Snakemake's --config parser hands over (cli.parse_config: int, float, True/False, else
# YAML's base loader, whose scalars are all strings), and what the schema wants.
@pytest.mark.parametrize(
    ("given", "wanted"),
    [
        ({"levels": ["1"]}, {"levels": [1]}),  # levels=[1]
        ({"levels": ["1", "3"]}, {"levels": [1, 3]}),
        ({"levels": 2}, {"levels": [2]}),  # levels=2: one value for a list
        ({"tasks": ["1/12"]}, {"tasks": ["1/12"]}),  # tasks='["1/12"]'
        ({"tasks": "1/12"}, {"tasks": ["1/12"]}),
        ({"modes": "default"}, {"modes": ["default"]}),
        ({"paper": {"outer_trials": "5"}}, {"paper": {"outer_trials": 5}}),  # 'paper={outer_trials: 5}'
        ({"paper": {"atol": "0.1", "rtol": "1e-3"}}, {"paper": {"atol": 0.1, "rtol": 0.001}}),
        ({"paper": {"atol": "1"}}, {"paper": {"atol": 1}}),
        ({"paper": {"early_stop_below": "null"}}, {"paper": {"early_stop_below": None}}),
        ({"build": {"construct_on_cpu": "false"}}, {"build": {"construct_on_cpu": False}}),
        ({"timeouts": {"demo": "80"}}, {"timeouts": {"demo": 80}}),
        ({"aggregate_only": "true"}, {"aggregate_only": True}),
        ({"aggregate_only": "No"}, {"aggregate_only": False}),
        ({"aggregate_only": 1}, {"aggregate_only": True}),  # aggregate_only=1 arrives as an int
        ({"aggregate_only": True}, {"aggregate_only": True}),  # aggregate_only=True
        ({"device": 3090}, {"device": "3090"}),  # device=3090 arrives as an int
        ({"max_attempts": 2}, {"max_attempts": 2}),
        ({"strict": {"modes": "null"}}, {"strict": {"modes": None}}),
        ({"strict": {"modes": ["default"], "min_reps": "4"}}, {"strict": {"modes": ["default"], "min_reps": 4}}),
        ({"strict": {"modes": "cudnn"}}, {"strict": {"modes": ["cudnn"]}}),
        ({"release_dir": None}, {"release_dir": None}),  # release_dir= (empty)
        ({"release_dir": "null"}, {"release_dir": None}),
        ({"release_dir": "../shared/cuda-l1"}, {"release_dir": "../shared/cuda-l1"}),
        ({"release_sha256": {"a.json": "ab" * 32}}, {"release_sha256": {"a.json": "ab" * 32}}),
        ({"build": {"cuda_arch_list": "9.0"}}, {"build": {"cuda_arch_list": "9.0"}}),  # a string stays one
        ({"build": {"cuda_arch_list": 9.0}}, {"build": {"cuda_arch_list": "9.0"}}),
    ],
)
def test_command_line_values_are_typed_by_the_schema(given, wanted):
    assert normalised(**given) == wanted
    assert config_error(wanted, SCHEMA) is None  # and then they validate


def test_a_value_of_alternative_types_takes_the_one_it_spells():
    schema = {"properties": {"bound": {"oneOf": [{"type": "integer", "minimum": 0},
                                                 {"type": "string", "enum": ["auto"]}]}}}
    for given, wanted in (("3", 3), ("auto", "auto")):
        cfg = {"bound": given}
        cliconfig.normalise(cfg, schema)
        assert cfg == {"bound": wanted}


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ({"levels": "abc"}, "config levels.0: 'abc' is not of type 'integer'"),
        ({"levels": ["x"]}, "config levels.0: 'x' is not of type 'integer'"),
        ({"paper": {"outer_trials": "many"}}, "config paper.outer_trials: 'many' is not of type 'integer'"),
        ({"paper": {"atol": "1,5"}}, "config paper.atol: '1,5' is not of type 'number'"),
        ({"aggregate_only": "maybe"}, "config aggregate_only: 'maybe' is not of type 'boolean'"),
        ({"device": True}, "config device: True is not of type 'string'"),
        ({"max_attempts": 2.5}, "config max_attempts: 2.5 is not of type 'integer'"),
        ({"tasks": ["L1_12"]}, "config tasks.0: 'L1_12' is not LEVEL/TASK (e.g. 1/12) or a task id (L1_T012)"),
    ],
)
def test_a_value_that_does_not_fit_is_left_for_the_schema_to_name(given, problem):
    assert config_error(normalised(**given), SCHEMA) == problem


def test_unknown_keys_are_left_alone():
    assert normalised(nope="1", paper={"nope": "2"}) == {"nope": "1", "paper": {"nope": "2"}}


def dry_run(*config):
    cmd = SNAKEMAKE + ["-n", "-q", "rules", "--config", "device=demo", *config]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_nested_numbers_and_lists_plan_from_the_command_line():
    proc = dry_run("levels=[1]", "paper={outer_trials: 5, atol: 0.02}", "aggregate_only=false")
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("levels=abc", "config levels.0: 'abc' is not of type 'integer'"),
        ("paper={outer_trials: 0}", "config paper.outer_trials: 0 is less than the minimum of 1"),
    ],
)
def test_a_schema_error_is_one_line_on_stderr(value, line):
    proc = dry_run(value)
    assert proc.returncode == 1
    ours = [x for x in proc.stderr.splitlines() if not x.startswith(("Using workflow", "Config file"))]
    assert ours == [line], proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


def test_every_key_of_the_config_file_reads_back_from_the_command_line():
    """Each documented key (config/config.yaml), written on the command line as KEY=VALUE in
    YAML's flow style and parsed as Snakemake parses --config, is typed back to the file's value."""
    import yaml
    from snakemake.cli import parse_config

    documented = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    for key, value in documented.items():
        text = yaml.safe_dump(value, default_flow_style=True, width=10**6).removesuffix("\n...\n").strip()
        given = parse_config([f"{key}={text}"])
        cliconfig.normalise(given, SCHEMA)
        assert given == {key: value}, (key, text)


def test_the_default_schema_is_the_repositorys():
    """cliconfig.SCHEMA, the schema an editable install finds, types as the workflow's does."""
    cfg = {"aggregate_only": "Yes", "device": 3090}
    cliconfig.normalise(cfg, cliconfig.SCHEMA)
    assert cfg == {"aggregate_only": True, "device": "3090"}
    for raw, want in (("false", False), ("0", False), ("no", False), ("1", True), ("TRUE", True)):
        cfg = {"aggregate_only": raw}
        cliconfig.normalise(cfg, cliconfig.SCHEMA)
        assert cfg["aggregate_only"] is want
    cfg = {"aggregate_only": "maybe", "device": True}  # left for the schema to reject
    cliconfig.normalise(cfg, cliconfig.SCHEMA)
    assert cfg == {"aggregate_only": "maybe", "device": True}
