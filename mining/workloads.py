"""Prompt workloads for `draftwheel traffic`: built offline and deterministically from a seed.

Built-in workloads, each item `{"prompt": str, "slice": str}`:
- `code`: "complete this function" prompts cut from function definitions (signature, docstring, first
  lines) in the Python standard library sources of this interpreter (sysconfig's stdlib path);
- `prose`: English paragraphs from the same library's module and function docstrings, with
  summarise / rewrite / continue instructions;
- `chat`: instruction templates crossed with everyday topics;
- `mixed`: the three interleaved.
Same seed and same Python version -> same prompts. Code and prose are drawn from every file of the
library at once, so two seeds are two samples of one distribution: the traffic a round trains on and
the traffic served after it are the same kind (drawing file by file, seed 1's 80 code prompts came
from 7 files and seed 2's from 6 others, a second shift rather than more of the first). When a source
runs out, prompts repeat (as real traffic does). A workload file is JSONL with `prompt` and `slice` per
line (`read_workload` / `write_workload`), so users bring their own. Running the prompts is
`draftwheel.mining.replay_workload`'s job.
"""

from __future__ import annotations

import ast
import functools
import itertools
import json
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path

CODE_TEMPLATES = [
    "Complete this Python function:\n\n```python\n{body}\n```",
    "Finish the implementation of this function:\n\n{body}",
    "Write the rest of this Python code:\n\n{body}",
]
PROSE_TEMPLATES = [
    "Summarize the following text in two sentences:\n\n{body}",
    "Rewrite this paragraph in simpler words:\n\n{body}",
    "Continue this text with one more paragraph:\n\n{body}",
    "What is the main point of this passage?\n\n{body}",
]
CHAT_TEMPLATES = [
    "Write a short poem about {topic}.", "Explain {topic} to a ten-year-old.",
    "Give me three practical tips about {topic}.", "What are the pros and cons of {topic}?",
    "Write a polite email to a colleague asking for advice on {topic}.", "Tell me a fun fact about {topic}.",
    "Describe {topic} in one paragraph.", "Make a short checklist for {topic}.",
    "What questions should a beginner ask about {topic}?", "Summarize the history of {topic} in a few sentences.",
]
TOPICS = [
    "the ocean", "gardening", "learning to cook", "saving money", "public transport", "time management",
    "the moon", "writing a resume", "healthy sleep", "climate change", "chess", "volcanoes", "bicycles",
    "coffee", "remote work", "photography", "rainforests", "the printing press", "job interviews",
    "recycling", "meditation", "learning a language", "the solar system", "bread baking", "hiking safety",
    "electric cars", "birds", "public speaking", "friendship", "museums", "board games", "the internet",
]
BUILTIN = ("code", "prose", "chat", "mixed", "sql", "tools", "templated")

# Templated traffic, as agentic and SQL-generating services see it: a few fixed templates whose answers
# share long spans from request to request (what the suffix tier copies), different values each time.
SCHEMAS = [
    "orders(id INTEGER, customer_id INTEGER, total REAL, status TEXT, created_at DATE)",
    "employees(id INTEGER, name TEXT, department TEXT, salary REAL, hired_on DATE)",
    "products(id INTEGER, name TEXT, category TEXT, price REAL, stock INTEGER)",
]
SQL_TEMPLATES = [
    "Table: {schema}. Write a SQL query that returns all rows where {num} is greater than {value}, ordered "
    "by {num} descending, limited to {limit} rows. Answer with the SQL query only.",
    "Table: {schema}. Write a SQL query that counts the rows for each {text} and returns only the groups "
    "with more than {value} rows. Answer with the SQL query only.",
]
WEATHER_TEMPLATE = ("You are an agent. Call the tool get_weather for the city {city} in {unit}. Reply only with a JSON "
                    'object of the form {{"tool": "get_weather", "arguments": {{"city": ..., "unit": ...}}}}.')
TOOL_TEMPLATES = [
    WEATHER_TEMPLATE,
    "You are an agent. Call the tool convert_currency to convert {value} EUR to {currency}. Reply only with a "
    'JSON object of the form {{"tool": "convert_currency", "arguments": {{"amount": ..., "to": ...}}}}.',
    "You are an agent. Call the tool book_table for {limit} people at {value_time} in {city}. Reply only with a "
    'JSON object of the form {{"tool": "book_table", "arguments": {{"city": ..., "people": ..., "time": ...}}}}.',
]
_NUM = {0: ["total", "customer_id"], 1: ["salary", "id"], 2: ["price", "stock"]}
_TEXT = {0: "status", 1: "department", 2: "category"}
_CITIES = ["Paris", "Berlin", "Madrid", "Oslo", "Lisbon", "Vienna", "Prague", "Dublin", "Athens", "Warsaw"]


def templated_prompts(n: int, seed: int, templates: list[str] | None = None) -> list[str]:
    """n templated requests, cycling through `templates` (default: the two SQL templates and the weather
    tool call); different seeds give different values in the same templates."""
    templates = templates or SQL_TEMPLATES + [WEATHER_TEMPLATE]
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        table = rng.randrange(len(SCHEMAS))
        prompts.append(templates[i % len(templates)].format(
            schema=SCHEMAS[table], num=rng.choice(_NUM[table]), text=_TEXT[table], value=rng.randrange(10, 5000),
            limit=rng.choice([5, 10, 20, 50]), city=rng.choice(_CITIES), unit=rng.choice(["celsius", "fahrenheit"]),
            currency=rng.choice(["USD", "GBP", "JPY", "CHF"]), value_time=f"{rng.randrange(11, 23)}:{rng.choice(['00', '30'])}"))
    return prompts
MAX_CODE_CHARS = 1200
MAX_PROSE_CHARS = 900


def _stdlib_files() -> list[Path]:
    return sorted(p for p in Path(sysconfig.get_paths()["stdlib"]).glob("*.py") if not p.name.startswith("_"))


def _parse(path: Path) -> tuple[ast.Module, list[str]] | None:
    try:
        source = path.read_text(encoding="utf-8")
        return ast.parse(source), source.splitlines()
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _function_prefixes(path: Path) -> Iterator[str]:
    """Signature + docstring + first two body lines of each documented function with a real body."""
    parsed = _parse(path)
    if parsed is None:
        return
    tree, lines = parsed
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
            continue
        if len(node.body) < 3 or node.body[0].end_lineno is None:
            continue
        end = node.body[0].end_lineno + 2
        snippet = lines[node.lineno - 1:end]
        indent = len(snippet[0]) - len(snippet[0].lstrip())
        text = "\n".join(line[indent:] for line in snippet)
        if len(text) <= MAX_CODE_CHARS:
            yield text


def _paragraphs(path: Path) -> Iterator[str]:
    """English paragraphs (mostly letters, >= 200 chars) from module and function docstrings."""
    parsed = _parse(path)
    if parsed is None:
        return
    for node in ast.walk(parsed[0]):
        if not isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            continue
        for paragraph in (ast.get_docstring(node) or "").split("\n\n"):
            text = " ".join(paragraph.split())
            letters = sum(c.isalpha() or c.isspace() for c in text)
            if 200 <= len(text) and letters >= 0.85 * len(text) and ">>>" not in text:
                yield text[:MAX_PROSE_CHARS]


@functools.cache
def library_texts(extract) -> tuple[tuple[str, str], ...]:
    """(file name, text) for each distinct text `extract` finds in the library, in file order (~1.6 s, once)."""
    seen: dict[str, str] = {}
    for path in _stdlib_files():
        for text in extract(path):
            seen.setdefault(text, path.name)
    return tuple((name, text) for text, name in seen.items())


def _from_stdlib(n: int, seed: int, extract, templates: list[str], name: str) -> list[dict[str, str]]:
    rng = random.Random(f"{name}:{seed}")
    bodies = [text for _, text in library_texts(extract)]
    if not bodies:
        raise RuntimeError(f"workload {name!r}: no usable text found under {sysconfig.get_paths()['stdlib']}")
    rng.shuffle(bodies)
    chosen = list(itertools.islice(itertools.cycle(bodies), n))
    return [{"prompt": rng.choice(templates).format(body=body), "slice": name} for body in chosen]


def _chat(n: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(f"chat:{seed}")
    pairs = [(t, topic) for t in CHAT_TEMPLATES for topic in TOPICS]
    rng.shuffle(pairs)
    chosen = list(itertools.islice(itertools.cycle(pairs), n))
    return [{"prompt": template.format(topic=topic), "slice": "chat"} for template, topic in chosen]


def build_workload(name: str, n: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` prompts of the built-in workload `name` (code, prose, chat, mixed, and the templated sql, tools
    and templated = both), deterministic in `seed`."""
    if n < 0:
        raise ValueError(f"n: must be >= 0, got {n}")
    if name == "code":
        return _from_stdlib(n, seed, _function_prefixes, CODE_TEMPLATES, "code")
    if name == "prose":
        return _from_stdlib(n, seed, _paragraphs, PROSE_TEMPLATES, "prose")
    if name == "chat":
        return _chat(n, seed)
    if name in ("sql", "tools", "templated"):
        templates = {"sql": SQL_TEMPLATES, "tools": TOOL_TEMPLATES, "templated": SQL_TEMPLATES + TOOL_TEMPLATES}[name]
        return [{"prompt": p, "slice": name} for p in templated_prompts(n, seed, templates)]
    if name == "mixed":
        parts = [build_workload(part, -(-n // 3), seed) for part in ("code", "prose", "chat")]
        return [item for group in zip(*parts) for item in group][:n]
    raise ValueError(f"workload: unknown built-in {name!r}; expected one of {', '.join(BUILTIN)} or a JSONL file")


def read_workload(path: str | Path) -> list[dict[str, str]]:
    """A JSONL workload: one object per line with a string `prompt` and optional string `slice`."""
    items = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc.msg}") from exc
            if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
                raise ValueError(f"{path}:{number}: expected an object with a string 'prompt'")
            slice_name = item.get("slice", "custom")
            if not isinstance(slice_name, str):
                raise ValueError(f"{path}:{number}: 'slice' must be a string")
            items.append({"prompt": item["prompt"], "slice": slice_name})
    return items


def write_workload(items: list[dict[str, str]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for item in items:
            handle.write(json.dumps({"prompt": item["prompt"], "slice": item["slice"]}, ensure_ascii=False) + "\n")
    return path


def load_workload(spec: str, n: int | None, seed: int = 0) -> list[dict[str, str]]:
    """A built-in name or a JSONL path; with a file, `n` takes the first n items (None = all)."""
    if spec in BUILTIN:
        return build_workload(spec, 30 if n is None else n, seed)
    if not Path(spec).is_file():
        raise ValueError(f"workload: {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor a file")
    items = read_workload(spec)
    return items if n is None else items[:n]
