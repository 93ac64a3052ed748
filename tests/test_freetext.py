"""Free text vs code: which text is compared by meaning, and which exactly (table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from replay_sim.freetext import is_code_like, is_free_text, looks_like_code, outside_literals
from replay_sim.variants import Transform

STRING = {"type": "string"}


@pytest.mark.parametrize(
    ("name", "prop", "code"),
    [
        ("sql", STRING, True),
        ("sql_query", STRING, True),
        ("expression", STRING, True),
        ("formula", STRING, True),
        ("script", STRING, True),
        ("command", STRING, True),
        ("jq", STRING, True),
        ("xpath", STRING, True),
        ("filter", STRING, True),
        ("pattern", STRING, True),
        ("query", {"type": "string", "description": "SELECT SQL query to execute"}, True),
        ("query", {"type": "string", "description": "A Cypher query"}, True),
        ("query", {"type": "string", "description": "Search query (supports boolean operators)"}, True),
        ("text", {"type": "string", "description": "A regular expression to match"}, True),
        ("q", {"type": "string", "format": "regex"}, True),
        ("query", {"anyOf": [{"type": "string", "description": "an SQL statement"}, {"type": "null"}]}, True),
        ("query", {"type": "string", "description": "The search query to match against entity names"}, False),
        ("message", STRING, False),
        ("prompt", {"type": "string", "description": "What to ask the model"}, False),
    ],
)
def test_the_schema_says_which_text_is_code(name: str, prop: dict[str, Any], code: bool) -> None:
    assert is_code_like(name, prop) is code
    if code:
        assert not is_free_text(name, prop)  # code is never compared by meaning


@pytest.mark.parametrize(
    "text",
    [
        "SELECT * FROM products ORDER BY price DESC",
        "select name from products where category = 'tools'",
        "  SELECT COUNT(*) AS n FROM orders ",
        "INSERT INTO t (a) VALUES (1)",
        "UPDATE products SET price = price * 2",
        "name LIKE 'G%'",
        "2 + 3 * 4",
        "16^0.5",
        "pow(2, 10)",
        "x == 1 && y",
        "*.py",
        "src/**/*.ts",
        "file?.txt",
        "^foo.*bar$",
        "[a-z]+",
        r"\d{3}",
        "a{1,}",
        "/tmp/notes.txt",
        "src/main.py",
        r"C:\Users\me",
        ".items[0].name",
        "$.store.book[*]",
        "//div[@id='x']",
        "#FF8800",
        "rgb(255, 0, 0)",
        "*/5 * * * *",
        "ls -la | grep foo",
        "def f(x): return x",
        "user_id",
        "https://example.org/a",
        "14:30",
        "1,2,3",
    ],
)
def test_code_shaped_text_is_recognised(text: str) -> None:
    assert looks_like_code(text)


@pytest.mark.parametrize(
    "text",
    [
        "how do I reset my password",
        "How do I reset my password?",
        "what is the refund policy for orders",
        "Ada Lovelace",
        "who is Alice",
        "space rockets",
        "Understand the question",
        "What's the weather in Paris today?",
        "tell me about rockets (the space kind)",
        "Hello, world!",
        "select a good book",
        "update my address",
        "top 10 movies",
        "50% off deals",
        "C++ tutorials",
    ],
)
def test_prose_is_not_code(text: str) -> None:
    assert not looks_like_code(text)


@pytest.mark.parametrize(
    ("text", "folded", "varied"),
    [
        # SQL ignores the case of keywords and names, never of a string literal: a case difference
        # learned from other queries must not make 'widget' the same as 'Widget'.
        (
            "SELECT * FROM products WHERE name = 'Widget'",
            "select * from products where name = 'Widget'",
            "select * from PRODUCTS where NAME = 'Widget'",  # both ways, on every token class
        ),
        ("SELECT \"Name\" FROM t WHERE a = 'It\\'s'", "select \"Name\" from t where a = 'It\\'s'", None),
        ("name LIKE 'g%' AND x = `Col`", "name like 'g%' and x = `Col`", "NAME like 'g%' and X = `Col`"),
        ("Chess", "chess", "CHESS"),  # prose: all of it
        ("It's a dog's life", "it's a dog's life", "IT'S A DOG'S LIFE"),
        ("WHERE A = 'x'", "where a = 'x'", "where a = 'x'"),  # all capitals outside: lower-cased
    ],
)
def test_a_case_difference_in_code_leaves_its_quoted_literals_alone(
    text: str, folded: str, varied: str | None
) -> None:
    assert Transform.CASE.apply(text) == folded
    if varied is not None:
        assert Transform.CASE.vary(text) == varied
        assert Transform.CASE.apply(varied) == folded  # the variant is the same text, for the resolver
    assert Transform.CASE.apply("SELECT * FROM products WHERE name = 'widget'") != folded


def test_outside_literals_changes_everything_in_prose_and_nothing_inside_quotes_in_code() -> None:
    assert outside_literals("say 'Hello' twice", str.upper) == "SAY 'HELLO' TWICE"
    assert outside_literals("SELECT 'Hello' FROM t", str.lower) == "select 'Hello' from t"
