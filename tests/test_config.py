"""Config errors are one line, name the key, and say what is expected."""

import pytest
from helpers import config_text, ratchet, score_repo

from ratchet.core.config import ConfigError, parse_duration
from ratchet.driver.config import loads_config


def load(text: str):
    return loads_config(text.encode(), "ratchet.toml")


def test_valid_config_parses_durations_and_margins():
    cfg = load(config_text() + '[acceptance]\nmin_improvement = "0.5%"\nrepeats = 3\n')
    assert cfg.task.timeout == 60.0
    assert cfg.acceptance.min_improvement.relative
    assert cfg.acceptance.min_improvement.margin(200.0) == pytest.approx(1.0)
    assert cfg.metric.goal == "minimize"


@pytest.mark.parametrize(
    "text,expected",
    [("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0), ("250ms", 0.25), (30, 30.0)],
)
def test_durations(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda t: t.replace('timeout = "60s"', 'timeout = "60s"\ntimout = 3'),
         "task.timout: unknown key"),
        (lambda t: t.replace('timeout = "60s"', 'timeout = "soon"'), "task.timeout"),
        (lambda t: t.replace('evaluate = "python evaluate.py"\n', ""),
         "task.evaluate: required key is missing"),
        (lambda t: t.replace('editable = ["solution.py"]', 'editable = ["/etc/passwd"]'),
         "task.editable"),
        (lambda t: t.replace('editable = ["solution.py"]', 'editable = ["sol[ution.py"]'),
         "not a valid glob"),
        (lambda t: t.replace("parallel = 2", 'parallel = "four"'), "search.parallel"),
        (lambda t: t.replace('goal = "minimize"', 'goal = "lower"'), "task.metric.goal"),
        (lambda t: t.replace('"solution.py:X"', '"other.py:X"'), "not in task.editable"),
        (lambda t: t + '[acceptance]\nmin_improvement = "lots"\n', "acceptance.min_improvement"),
        (lambda t: t + "[bogus]\nx = 1\n", "bogus: unknown key"),
        (lambda t: t.replace("[task]", "[task"), "not valid TOML"),
        (lambda t: t.replace("rounds = 3", 'rounds = 3\nmode = "sideways"'), "search.mode"),
        (lambda t: t.replace("rounds = 3", "rounds = 3\ncandidates = 0"), "search.candidates"),
    ],
)
def test_config_errors_name_the_key(mutate, needle):
    with pytest.raises(ConfigError) as info:
        load(mutate(config_text()))
    message = str(info.value)
    assert needle in message
    assert "\n" not in message
    assert message.startswith("ratchet.toml:")


def test_cli_reports_config_error_in_one_line(tmp_path):
    repo = score_repo(tmp_path / "r")
    (repo / "ratchet.toml").write_text(config_text().replace("rounds = 3", "rounds = -1"))
    proc = ratchet(repo, "run")
    assert proc.returncode == 2
    assert "search.rounds" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (repo / ".ratchet" / "ledger.db").exists()


def test_metric_never_printed_stops_with_clear_error(tmp_path):
    repo = score_repo(tmp_path / "r", metric='[task.metric]\nname = "val_bpb"\n')
    proc = ratchet(repo, "run")
    assert proc.returncode == 2, proc.stderr
    assert "printed no 'val_bpb: <number>' line" in proc.stderr
    assert "baseline" in proc.stderr


def test_not_a_git_repo(tmp_path):
    (tmp_path / "ratchet.toml").write_text(config_text())
    proc = ratchet(tmp_path, "run")
    assert proc.returncode == 2
    assert "not a git repository" in proc.stderr


@pytest.mark.parametrize(
    "mutate,needle",
    [
        (lambda t: t.replace("editable =", "editabel ="),
         "ratchet.toml: task.editabel: unknown key; did you mean 'editable'?"),
        (lambda t: t.replace("[task.metric]", "[task.metrik]"),
         "ratchet.toml: task.metrik: unknown key; did you mean 'metric'?"),
        (lambda t: t.replace("{ choices", "{ choises"),
         "ratchet.toml: tune.knobs.solution.py:X.choises: unknown key; did you mean "
         "'choices'?"),
        (lambda t: t.replace("[search]", "[serach]"),
         "ratchet.toml: serach: unknown key; did you mean 'search'?"),
    ],
)
def test_misspelt_key_is_named_first_with_what_it_meant(mutate, needle):
    with pytest.raises(ConfigError) as info:
        load(mutate(config_text()))
    message = str(info.value)
    assert message.startswith(needle), message
    # the required key it explains is not reported as a second problem
    assert "missing" not in message
    if "choises" not in needle:  # (a knob with no choices is a problem of its own)
        assert "more problem" not in message


def test_misspelling_comes_before_other_problems():
    text = config_text().replace("editable =", "editabel =").replace("rounds = 3",
                                                                      "rounds = -1")
    with pytest.raises(ConfigError) as info:
        load(text)
    assert str(info.value).startswith("ratchet.toml: task.editabel: unknown key")
    assert "(and 1 more problem)" in str(info.value)


def test_tune_without_knobs_is_valid_config():
    """`submit` / `wait` use no proposer; the knobs are checked when the tuner is built."""
    cfg = load(config_text(knobs=""))
    assert cfg.search.proposer == "tune" and not cfg.tune.knobs


def test_misspelling_helper_works_for_any_section_model():
    """Engines and proposers validate their own sections; they can name the key meant."""
    from pydantic import BaseModel, ConfigDict, ValidationError

    from ratchet.core.config import misspelling

    class Section(BaseModel):
        model_config = ConfigDict(extra="forbid")
        address: str = ""
        queue_timeout: float = 0.0

    with pytest.raises(ValidationError) as info:
        Section.model_validate({"adress": "x"})
    assert misspelling(info.value.errors()[0], Section) == "address"
    with pytest.raises(ValidationError) as info:
        Section.model_validate({"colour": "x"})
    assert misspelling(info.value.errors()[0], Section) is None
