"""Every method under its token budget, token accounting against the engine, greedy identities,
and the errors for bad input."""

from __future__ import annotations

from collections import defaultdict

import pytest

from creditrl.config import ConfigError, load_config
from creditrl.policy.engines import make_engine
from creditrl.policy.tokenizer import encode_prompt
from creditrl.search import METHOD_NAMES, METHODS, SearchConfig, search
from creditrl.train.evaluate import evaluate

MAX_NEW = 32


class CountingEngine:
    """Passes calls through and records every returned token sequence with its prompt."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.rows: list[tuple[tuple[int, ...], int]] = []  # (prompt, number of tokens returned)
        self.calls = 0

    def generate(self, prompts, n, params, *, generator=None, budgets=None):
        gen = self.engine.generate(prompts, n, params, generator=generator, budgets=budgets)
        self.calls += 1
        self.rows += [(tuple(p), len(t)) for p, t in zip(gen.prompt_ids, gen.tokens)]
        return gen

    def per_problem(self, tok, problems) -> list[int]:
        """Tokens returned for each problem, matched by its bos + prompt prefix."""
        heads = [tuple(encode_prompt(tok, p.prompt)) for p in problems]
        out = defaultdict(int)
        for prompt, n in self.rows:
            (owner,) = [i for i, h in enumerate(heads) if prompt[: len(h)] == h]
            out[owner] += n
        return [out[i] for i in range(len(problems))]


CONFIGS = {
    "best_of_n prm_min": dict(method="best_of_n", n=4, selector="prm_min"),
    "best_of_n majority": dict(method="best_of_n", n=4, selector="majority"),
    "beam": dict(method="beam", width=2, expansions=2),
    "mcts prm": dict(method="mcts", expansions=2, simulations=12),
    "mcts rollout_orm": dict(method="mcts", expansions=2, leaf_value="rollout_orm", simulations=6),
    "mcts rollout_oracle": dict(method="mcts", expansions=2, leaf_value="rollout_oracle", simulations=6, rollouts=2),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_budget_is_respected_and_counted_exactly(name, step_policy, tiny_prm, task, problems) -> None:
    model, tok = step_policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    for budget in (1, 20, 70, 400):  # 1 and 20 are below one full response (MAX_NEW = 32)
        proxy = CountingEngine(engine)
        cfg = SearchConfig(budget=budget, max_new_tokens=MAX_NEW, **CONFIGS[name])
        result = search(problems, engine=proxy, tokenizer=tok, task=task, config=cfg, prm=tiny_prm, orm=tiny_prm)
        spent = [r.tokens for r in result.problems]
        assert spent == proxy.per_problem(tok, problems), (name, budget)
        assert all(1 <= s <= budget for s in spent), (name, budget, spent)
        assert result.tokens_total == sum(spent) and result.engine_calls == proxy.calls
    assert max(spent) > 2 * MAX_NEW  # the large budget let the search spend more than two responses' worth


def test_greedy_search_equals_evaluate(step_policy, task, problems) -> None:
    model, tok = step_policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    result = search(
        problems,
        engine=engine,
        tokenizer=tok,
        task=task,
        config=SearchConfig(method="greedy", budget=1000, max_new_tokens=MAX_NEW),
    )
    reference = evaluate(model, tok, task, problems, max_new_tokens=MAX_NEW)
    assert [r.completion for r in result.problems] == reference.completions
    assert result.tokens_mean == pytest.approx(reference.mean_length)
    assert result.engine_calls == 1


def test_beam_with_one_beam_one_expansion_at_temperature_zero_is_greedy(step_policy, tiny_prm, task, problems) -> None:
    model, tok = step_policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    greedy = search(
        problems,
        engine=engine,
        tokenizer=tok,
        task=task,
        config=SearchConfig(method="greedy", budget=1000, max_new_tokens=MAX_NEW),
    )
    beam = search(
        problems,
        engine=engine,
        tokenizer=tok,
        task=task,
        prm=tiny_prm,
        config=SearchConfig(method="beam", width=1, expansions=1, temperature=0.0, budget=1000, max_new_tokens=MAX_NEW),
    )
    assert [r.completion for r in beam.problems] == [r.completion for r in greedy.problems]
    assert [r.tokens for r in beam.problems] == [r.tokens for r in greedy.problems]  # nothing wasted either
    assert beam.engine_calls > greedy.engine_calls  # ... but step by step: one call per step
    assert any(r.completion.count(";") >= 2 for r in greedy.problems)  # several steps, so this tests something


def test_registry_matches_config_names() -> None:
    assert tuple(METHODS) == METHOD_NAMES


@pytest.mark.parametrize(
    "override, message",
    [
        ("method=sampling", "search.method: unknown value 'sampling'; valid: beam, best_of_n, greedy, mcts"),
        ("budget=0", "search.budget: must be >= 1, got 0"),
        (
            "leaf_value=value_net",
            "search.leaf_value: unknown value 'value_net'; valid: prm, rollout_oracle, rollout_orm",
        ),
        ("width=0", "search.width: must be >= 1, got 0"),
        ("width=wide", "search.width: expected an integer, got 'wide'"),
        (
            "beam_width=3",
            "unknown key 'beam_width' in section 'search'; valid keys: method, budget, .*; did you mean 'width'?",
        ),
    ],
)
def test_bad_search_settings_name_the_key(override, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(overrides=[f"search.{override}"])
    cfg = load_config(
        overrides=["search.method=beam", "search.width=3", "search.c_puct=2", "search.temperature=0.5"]
    ).search
    assert (cfg.method, cfg.width, cfg.c_puct, cfg.temperature) == ("beam", 3, 2.0, 0.5)


@pytest.mark.parametrize(
    "config, message",
    [
        (
            dict(method="best_of_n", selector="prm_max"),
            r"search.selector: unknown value 'prm_max'; valid: majority, orm, prm_last, prm_mean, prm_min, "
            r"prm_product; did you mean 'prm_mean'\?",
        ),
        (
            dict(method="beam", aggregation="max"),
            "search.aggregation: unknown value 'max'; valid: last, mean, min, product",
        ),
    ],
)
def test_registry_names_are_checked_by_search(config, message, step_policy, task, problems) -> None:
    model, tok = step_policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    with pytest.raises(ConfigError, match=message):
        search(problems, engine=engine, tokenizer=tok, task=task, config=SearchConfig(**config))


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(method="beam"), "method 'beam' .* needs a PRM to score steps: pass prm="),
        (dict(method="mcts"), "method 'mcts' .* needs a PRM"),
        (dict(method="best_of_n", selector="prm_product"), "method 'best_of_n' .* needs a PRM"),
        (dict(method="best_of_n", selector="orm"), "method 'best_of_n' .* needs an ORM to judge solutions"),
        (dict(method="mcts", leaf_value="rollout_orm"), "method 'mcts' .* needs an ORM"),
    ],
)
def test_missing_model_is_a_value_error(config, message, step_policy, task, problems) -> None:
    model, tok = step_policy
    engine = make_engine(model, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
    with pytest.raises(ValueError, match=message):
        search(problems, engine=engine, tokenizer=tok, task=task, config=SearchConfig(**config))
    # methods that need no model run without one
    for ok in (
        dict(method="greedy"),
        dict(method="best_of_n", selector="majority"),
        dict(method="mcts", leaf_value="rollout_oracle", simulations=2),
    ):
        search(problems, engine=engine, tokenizer=tok, task=task, config=SearchConfig(budget=40, **ok))
