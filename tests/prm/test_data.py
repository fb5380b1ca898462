"""The stepwise format: JSONL/Parquet round trips, located errors, PRM800K and Math-Shepherd importers."""

import json
import re

import pytest

from creditrl.prm.data import (
    StepwiseExample,
    import_math_shepherd,
    import_prm800k,
    load_stepwise,
    save_stepwise,
)

EXAMPLES = [
    StepwiseExample("7+3*2-5=", ["3*2=6;", "7+6=13;", "13-5=9;", "#9"], [1.0, 1.0, 0.0, None], {"seed": 3}),
    StepwiseExample("2+2=", ["2+2=4;", "#4"], [0.75, 1.0], {"src": "mc", "nested": {"a": [1, 2]}}),
    StepwiseExample("x², y?", ["Schritt 1: ü", "Step 2"], [None, None]),
]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def row(**fields):
    base = {"prompt": "1+1=", "completions": ["1+1=2;", "#2"], "labels": [1, True]}
    base.update(fields)
    return json.dumps(base)


# ----------------------------------------------------------------------------- format


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    save_stepwise(EXAMPLES, path)
    assert load_stepwise(path) == EXAMPLES
    assert load_stepwise(str(path)) == EXAMPLES


def test_parquet_round_trip_of_rows_with_only_unlabelled_steps(tmp_path):
    examples = [StepwiseExample("p", ["a"], [None])]
    save_stepwise(examples, tmp_path / "x.parquet")
    assert load_stepwise(tmp_path / "x.parquet") == examples


def test_labels_are_normalised_to_floats_and_none(tmp_path):
    path = write_lines(
        tmp_path / "x.jsonl", [row(completions=["a", "b", "c", "d", "e"], labels=[True, False, 1, 0, None])]
    )
    (example,) = load_stepwise(path)
    assert example.labels == [1.0, 0.0, 1.0, 0.0, None]
    assert all(type(x) is float for x in example.labels[:4])
    assert example.meta == {}


def test_blank_lines_are_skipped_but_counted(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", [row(), "", "   ", row(labels=[1, 2])])
    with pytest.raises(ValueError, match=re.escape(f"{path}, line 4, field 'labels': label 1 must be")):
        load_stepwise(path)


def test_empty_file_gives_no_examples_when_allowed(tmp_path):
    (tmp_path / "x.jsonl").write_text("")
    assert load_stepwise(tmp_path / "x.jsonl", allow_empty=True) == []


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_of_no_examples(tmp_path, suffix):
    save_stepwise([], tmp_path / f"x{suffix}")
    assert load_stepwise(tmp_path / f"x{suffix}", allow_empty=True) == []


def test_label_count_error_names_file_line_field_and_expectation(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", [row(), row(), row(completions=["a", "b", "c", "d"], labels=[1, 1, 0])])
    with pytest.raises(ValueError) as err:
        load_stepwise(path)
    assert str(err.value) == f"{path}, line 3, field 'labels': expected a list of 4 labels (one per step), got 3"


def test_invalid_json_names_line_and_json_error(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", [row(), '{"prompt": "a", '])
    with pytest.raises(ValueError, match=re.escape(f"{path}, line 2: invalid JSON: Expecting property name")):
        load_stepwise(path)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "a", "labels": [1]}', "field 'completions': missing"),
        (row(prompt=3), "field 'prompt': expected a string, got int"),
        (row(completions="1+1=2"), "field 'completions': expected a list of step strings, got str"),
        (row(completions=[], labels=[]), "field 'completions': expected at least one step, got an empty list"),
        (row(completions=["a", 7], labels=[1, 1]), "field 'completions': step 1 must be a string, got int"),
        (row(labels=[1.5, 1]), "field 'labels': label 0 must be a bool, a number in [0, 1] or null, got 1.5"),
        (row(labels=[1, -0.1]), "label 1 must be a bool, a number in [0, 1] or null, got -0.1"),
        (row(labels=["1", 1]), "label 0 must be a bool, a number in [0, 1] or null, got '1' (str)"),
        (row(labels=1), "field 'labels': expected a list of labels, got int"),
        (row(meta=[1]), "field 'meta': expected an object (dict), got list"),
    ],
)
def test_malformed_rows(tmp_path, line, message):
    path = write_lines(tmp_path / "x.jsonl", [line])
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        load_stepwise(path)
    assert str(err.value).startswith(f"{path}, line 1, ")


def test_parquet_errors_name_the_row(tmp_path):
    import datasets

    rows = [
        {"prompt": "a", "completions": ["x"], "labels": [1.0]},
        {"prompt": "b", "completions": ["x", "y"], "labels": [1.0]},
    ]
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    with pytest.raises(ValueError) as err:
        load_stepwise(path)
    assert str(err.value) == f"{path}, row 2, field 'labels': expected a list of 2 labels (one per step), got 1"


@pytest.mark.parametrize("fn", [load_stepwise, lambda p: save_stepwise(EXAMPLES, p)])
def test_unknown_extension(tmp_path, fn):
    path = tmp_path / "x.csv"
    path.write_text("")
    with pytest.raises(
        ValueError, match=re.escape(f"{path}: unsupported file extension '.csv'; expected one of .jsonl, .parquet")
    ):
        fn(path)


def test_example_checks_its_fields():
    with pytest.raises(
        ValueError, match=re.escape("field 'labels': expected a list of 2 labels (one per step), got 1")
    ):
        StepwiseExample("p", ["a", "b"], [1.0])
    with pytest.raises(ValueError, match="expected at least one step"):
        StepwiseExample("p", [], [])
    assert StepwiseExample("p", ["a", "b"], [True, 0]).labels == [1.0, 0.0]


# ----------------------------------------------------------------------------- PRM800K


def prm800k_row(steps, problem="What is 1+1?", finish_reason="solution", **question):
    return json.dumps(
        {
            "labeler": "x",
            "question": {"problem": problem, **question},
            "label": {"steps": steps, "total_time": 1, "finish_reason": finish_reason},
        }
    )


def step(*ratings, chosen=None, texts=None):
    texts = texts or [f"text {i}" for i in range(len(ratings))]
    completions = [{"text": t, "rating": r, "flagged": False} for t, r in zip(texts, ratings)]
    return {"completions": completions, "human_completion": None, "chosen_completion": chosen}


PRM800K_ROWS = [
    # chosen completions; a neutral step; stops at the first -1 (included), later steps dropped
    prm800k_row(
        [
            step(1, chosen=0, texts=["Let x = 1.", "alt"]),
            step(-1, 0, chosen=1, texts=["bad", "So 2x = 2."]),
            step(-1, 1, texts=["Then x + 1 = 3.", "unused"]),
            step(1, texts=["dropped"]),
        ],
        finish_reason="found_error",
        ground_truth_answer="2",
    ),
    # chosen_completion null -> the first completion; null rating -> unlabelled
    prm800k_row([step(None, 1, texts=["A.", "B."]), step(1, texts=["C."])], problem="P2"),
    # no steps (e.g. a bad problem): no example
    prm800k_row([], problem="P3", finish_reason="bad_problem"),
]


@pytest.mark.parametrize("neutral_as, expected", [(1.0, 1.0), (0.0, 0.0), (None, None)])
def test_prm800k_import(tmp_path, neutral_as, expected):
    path = write_lines(tmp_path / "prm800k.jsonl", PRM800K_ROWS)
    first, second = import_prm800k(path, neutral_as=neutral_as)
    assert first.prompt == "What is 1+1?"
    assert first.completions == ["Let x = 1.", "So 2x = 2.", "Then x + 1 = 3."]
    assert first.labels == [1.0, expected, 0.0]
    assert first.meta == {"source": "prm800k", "finish_reason": "found_error", "ground_truth_answer": "2"}
    assert second.prompt == "P2"
    assert second.completions == ["A.", "C."]
    assert second.labels == [None, 1.0]


def test_prm800k_default_counts_neutral_as_right(tmp_path):
    path = write_lines(tmp_path / "prm800k.jsonl", PRM800K_ROWS[:1])
    assert import_prm800k(path)[0].labels == [1.0, 1.0, 0.0]


@pytest.mark.parametrize(
    "line, message",
    [
        (prm800k_row([step(2)]), "field 'label.steps[0].completions[0].rating': expected -1, 0, 1 or null, got 2"),
        (
            prm800k_row([step(1), step(1, chosen=3)]),
            "field 'label.steps[1].chosen_completion': expected null or an index in [0, 0], got 3",
        ),
        (prm800k_row([{"completions": []}]), "field 'label.steps[0].completions': expected a non-empty list, got []"),
        (prm800k_row([{"completions": [{"rating": 1}]}]), "field 'label.steps[0].completions[0].text': missing"),
        (prm800k_row("steps"), "field 'label.steps': expected a list of steps, got str"),
        (json.dumps({"question": {}, "label": {"steps": []}}), "field 'question.problem': missing"),
        (json.dumps({"question": {"problem": "p"}}), "field 'label': missing"),
    ],
)
def test_prm800k_malformed_rows(tmp_path, line, message):
    path = write_lines(tmp_path / "prm800k.jsonl", [PRM800K_ROWS[1], line])
    with pytest.raises(ValueError) as err:
        import_prm800k(path)
    assert str(err.value) == f"{path}, line 2, {message}"


def test_prm800k_rejects_other_neutral_values(tmp_path):
    with pytest.raises(ValueError, match=re.escape("neutral_as must be 1.0, 0.0 or None, got 0.5")):
        import_prm800k(tmp_path / "x.jsonl", neutral_as=0.5)


# ----------------------------------------------------------------------------- Math-Shepherd

QUESTION = "Tom has 3 apples and buys 2 more. How many apples does he have?"
STEPS = ["Step 1: He buys 2, so 3 + 2 = 5.", "Step 2: He has 5 - 1 = 4 left.", "Step 3: The answer is: 4"]


def shepherd_row(signs, sep="\n", marker="ки", task="GSM8K"):
    text = QUESTION + sep + "".join(f"{s} {marker}\n" for s in STEPS)
    label = QUESTION + sep + "".join(f"{s} {c}\n" for s, c in zip(STEPS, signs))
    return json.dumps({"input": text, "label": label, "task": task}, ensure_ascii=False)


@pytest.mark.parametrize("sep", ["\n", " ", "\n\n"])
def test_math_shepherd_import(tmp_path, sep):
    path = write_lines(tmp_path / "shepherd.jsonl", [shepherd_row("+--", sep=sep), shepherd_row("+++", sep=sep)])
    first, second = import_math_shepherd(path)
    assert first.prompt == QUESTION
    assert first.completions == STEPS
    assert first.labels == [1.0, 0.0, 0.0]
    assert first.meta == {"source": "math_shepherd", "task": "GSM8K"}
    assert second.labels == [1.0, 1.0, 1.0]


def test_math_shepherd_custom_marker_and_first_step(tmp_path):
    text = "Q? (1) a <s> (2) b <s>"
    label = "Q? (1) a - (2) b +"
    path = write_lines(tmp_path / "s.jsonl", [json.dumps({"input": text, "label": label})])
    (example,) = import_math_shepherd(path, marker="<s>", first_step="(1)")
    assert (example.prompt, example.completions, example.labels) == ("Q?", ["(1) a", "(2) b"], [0.0, 1.0])
    assert example.meta == {"source": "math_shepherd"}


def shepherd_error(tmp_path, line):
    path = write_lines(tmp_path / "s.jsonl", [shepherd_row("+++"), line])
    with pytest.raises(ValueError) as err:
        import_math_shepherd(path)
    assert str(err.value).startswith(f"{path}, line 2, field ")
    return str(err.value)


def test_math_shepherd_marker_count_mismatch(tmp_path):
    good = json.loads(shepherd_row("++-"))
    good["label"] = good["label"].replace(" -\n", "\n")  # the last step lost its label
    message = shepherd_error(tmp_path, json.dumps(good, ensure_ascii=False))
    expected_len = len(good["input"]) - 3
    assert message.endswith(
        f"field 'label': expected the input with each of its 3 markers 'ки' replaced by one '+' or '-' "
        f"({expected_len} characters), got {expected_len - 2} characters"
    )


def test_math_shepherd_bad_label_char(tmp_path):
    message = shepherd_error(tmp_path, shepherd_row("+?+"))
    assert "field 'label': expected '+' or '-' at marker 1" in message and "got '?'" in message


def test_math_shepherd_label_text_differs(tmp_path):
    bad = json.loads(shepherd_row("+++"))
    bad["label"] = bad["label"].replace("Tom", "Tim")
    assert "field 'label': text before marker 0 differs from the input's" in shepherd_error(tmp_path, json.dumps(bad))


@pytest.mark.parametrize(
    "row_obj, message",
    [
        (
            {"input": "Q? no steps ки", "label": "Q? no steps +"},
            "field 'input': expected the steps to begin with 'Step 1:'; not found",
        ),
        (
            {"input": "Q? Step 1: a", "label": "Q? Step 1: a"},
            "field 'input': expected a step marker 'ки' after every step; found none",
        ),
        (
            {"input": "Q? Step 1: a ки tail", "label": "Q? Step 1: a + tail"},
            "expected only whitespace after the last marker 'ки', got ' tail'",
        ),
        (
            {"input": "Q ки? Step 1: a ки", "label": "Q +? Step 1: a +"},
            "field 'input': expected 'Step 1:' before the first marker 'ки'",
        ),
        ({"input": "Q? Step 1: a ки"}, "field 'label': missing"),
        ({"input": 3, "label": "x"}, "field 'input': expected a string, got int"),
    ],
)
def test_math_shepherd_malformed_rows(tmp_path, row_obj, message):
    assert message in shepherd_error(tmp_path, json.dumps(row_obj, ensure_ascii=False))


def test_imported_examples_round_trip_through_the_stepwise_format(tmp_path):
    write_lines(tmp_path / "prm800k.jsonl", PRM800K_ROWS)
    write_lines(tmp_path / "shepherd.jsonl", [shepherd_row("+-+")])
    examples = import_prm800k(tmp_path / "prm800k.jsonl") + import_math_shepherd(tmp_path / "shepherd.jsonl")
    save_stepwise(examples, tmp_path / "all.parquet")
    assert load_stepwise(tmp_path / "all.parquet") == examples
