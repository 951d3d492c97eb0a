"""ToolTalk's replay and metrics, from the `nvidia-tooltalk` wheel, with one offline change.

The published code runs unchanged: `ToolExecutor.init_conversation_state` (databases reset,
the ground-truth calls before a prediction point replayed), `ToolExecutor.execute_tool`
(session tokens injected, login and logout simulated), `ToolExecutor.evaluate_predictions`
(greedy matching of the conversation's predictions against all its ground-truth calls in
order, each API's own `check_api_call_correctness`) and `metrics.get_metrics`.

The one change: ToolTalk compares some free-text arguments (CreateEvent's name, description
and location, ModifyEvent's new_* ones, AddReminder's task, SendEmail's subject and body,
SendMessage's message) by the cosine of DistilBERT embeddings (`semantic_str_compare`,
which downloads `distilbert-base-uncased` from the Hugging Face hub). Nothing downloads
here, so with `semantic_match="normalized"` (the default) that comparison is 1.0 when the two
texts are equal after normalisation (`normalize_text`: casefolded, runs of whitespace made
one space, surrounding whitespace and punctuation stripped) and 0.0 otherwise (also for a
value that is not a string), against ToolTalk's own thresholds (0.8 or 0.9). With
`semantic_match="distilbert"` ToolTalk's own function runs (the model must be in the local
Hugging Face cache or be downloadable). The choice is made per thread (a context variable)
by a dispatcher installed in place of `semantic_str_compare` in the four API modules that use
it; code outside `semantic_mode(...)` gets ToolTalk's own function.

Two guards where the published code would raise on a model's input (it is written for
well-formed OpenAI function calls): a call whose execution raises out of ToolTalk's API
wrapper (an argument named `self`, say) gets the exception's text as its `exception`, and a
comparison that raises counts as no match (`Executor.compare_errors`).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import importlib.metadata
import json
import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib import resources
from typing import Any, Literal, get_args

from agentgym.extras import need

WHAT = "agentgym/ToolTalk-v0"
tool_executor = need("tooltalk.evaluation.tool_executor", WHAT)
metrics_module = need("tooltalk.evaluation.metrics", WHAT)
apis = need("tooltalk.apis", WHAT)

SemanticMatch = Literal["normalized", "distilbert"]
SEMANTIC_MATCHES: tuple[str, ...] = get_args(SemanticMatch)
SEMANTIC_MODULES = ("calendar", "email", "message", "reminder")
"""The `tooltalk.apis` modules whose matchers call `semantic_str_compare`."""

PARSE_FAILURE = "Failed to parse API call"  # ToolTalk's exception text for unreadable calls

_mode: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tooltalk_semantic", default=None
)
_PUNCTUATION = string.punctuation + string.whitespace


def normalize_text(text: str) -> str:
    """`text` casefolded, whitespace runs made one space, ends stripped of punctuation."""
    return re.sub(r"\s+", " ", text.casefold()).strip(_PUNCTUATION)


def normalized_compare(first: Any, second: Any) -> float:
    """The offline stand-in for ToolTalk's `semantic_str_compare`: 1.0 or 0.0 (see above)."""
    if not isinstance(first, str) or not isinstance(second, str):
        return 0.0  # ToolTalk: 0.0 for None; its tokenizer raises on other non-strings
    return 1.0 if normalize_text(first) == normalize_text(second) else 0.0


_published: Callable[[Any, Any], float] = importlib.import_module(
    "tooltalk.apis.utils"
).semantic_str_compare


def _dispatch(first: Any, second: Any) -> float:
    if _mode.get() == "normalized":
        return normalized_compare(first, second)
    return float(_published(first, second))


def _install() -> None:
    for name in SEMANTIC_MODULES:
        module = importlib.import_module(f"tooltalk.apis.{name}")
        if getattr(module, "semantic_str_compare", None) is not _dispatch:
            module.semantic_str_compare = _dispatch  # type: ignore[attr-defined]


_install()


@contextlib.contextmanager
def semantic_mode(mode: SemanticMatch) -> Iterator[None]:
    """ToolTalk's free-text comparisons in this thread use `mode` inside the block."""
    if mode not in SEMANTIC_MATCHES:
        raise ValueError(f"semantic_match={mode!r}; valid: {', '.join(SEMANTIC_MATCHES)}")
    token = _mode.set(mode)
    try:
        yield
    finally:
        _mode.reset(token)


def database_dir() -> Any:
    """The wheel's `tooltalk/data/databases` folder (the simulated APIs' initial state)."""
    return resources.files("tooltalk") / "data" / "databases"


class Executor(tool_executor.ToolExecutor):  # type: ignore[name-defined]
    """ToolTalk's `ToolExecutor` on the wheel's databases, with the two guards above."""

    def __init__(self) -> None:
        super().__init__(init_database_dir=str(database_dir()))
        self.compare_errors = 0

    def compare_api_calls(self, prediction: dict, ground_truth: dict) -> bool:
        try:
            return bool(super().compare_api_calls(prediction, ground_truth))
        except Exception:  # a matcher reading a model's odd arguments: no match
            self.compare_errors += 1
            return False

    def predict(self, name: str | None, arguments: Mapping[str, Any] | None) -> dict[str, Any]:
        """One predicted call run as `ToolExecutor.run_conversation` runs it: the prediction
        record it appends (role "api", request, response, exception). `arguments` None is
        a call that could not be read (ToolTalk's "Failed to parse API call")."""
        if arguments is None:
            request: dict[str, Any] = {"api_name": name or "", "parameters": None}
            response: dict[str, Any] = {"response": None, "exception": PARSE_FAILURE}
        else:
            try:
                request, response = self.execute_tool(name, dict(arguments))
            except Exception as err:  # raised outside ToolTalk's API wrapper
                request = {"api_name": name, "parameters": dict(arguments)}
                response = {"response": None, "exception": str(err) or type(err).__name__}
        return {
            "role": "api",
            "request": request,
            "response": response["response"],
            "exception": response["exception"],
        }


def evaluate(executor: Executor, conversation: dict[str, Any], mode: SemanticMatch) -> dict:
    """ToolTalk's `evaluate_predictions` metrics of `conversation` (annotated in place)."""
    with semantic_mode(mode):
        metrics: dict[str, Any] = executor.evaluate_predictions(conversation)["metrics"]
    return metrics


def result_text(record: Mapping[str, Any]) -> str:
    """A call's result as ToolTalk's OpenAI predictor shows it (the function message)."""
    payload = {"response": record["response"], "exception": record["exception"]}
    return json.dumps(payload, default=str)


def openai_docs() -> list[dict[str, Any]]:
    """Every API's document as ToolTalk gives it to the model (`api_mode="all"`)."""
    docs: list[dict[str, Any]] = [api.to_openai_doc() for api in apis.ALL_APIS]
    return docs


def requires_auth(name: str) -> bool:
    """Whether ToolTalk's executor injects the session token into calls of API `name`."""
    api = apis.APIS_BY_NAME.get(name)
    return bool(api is not None and api.requires_auth)


def scoring(categories: tuple[str, ...], mode: SemanticMatch, split_rule: str) -> dict:
    """The exact scoring configuration, as JSON (`ToolTalkEnv.scoring`)."""
    return {
        "benchmark": "tooltalk",
        "package": "nvidia-tooltalk",
        "package_version": importlib.metadata.version("nvidia-tooltalk"),
        "categories": list(categories),
        "splits": split_rule,
        "api_docs": "all (ToolTalk's api_mode='all': every API's to_openai_doc())",
        "protocol": (
            "tooltalk.evaluation.tool_executor.ToolExecutor.run_conversation: at each assistant "
            "turn of the dialogue the databases are reset and the ground-truth calls before it "
            "replayed; the model's calls run in the simulated APIs until it replies without "
            "one; the dialogue then continues with the ground-truth turn"
        ),
        "matcher": "tooltalk.evaluation.tool_executor.ToolExecutor.evaluate_predictions",
        "metrics": {
            "precision": "matches / predictions (0 without predictions)",
            "recall": "matches / ground-truth calls",
            "action_precision": "valid actions / actions (1 without actions)",
            "bad_action_rate": "actions that succeeded without matching / actions (0 without)",
            "success": "recall == 1 and bad_action_rate == 0 (reward part 'correctness')",
        },
        "semantic_str_compare": (
            "distilbert-base-uncased cosine (ToolTalk's own)"
            if mode == "distilbert"
            else "offline fallback: 1.0 if equal after casefolding, collapsing whitespace and "
            "stripping surrounding punctuation, else 0.0 (ToolTalk: DistilBERT cosine >= 0.8/0.9)"
        ),
        "semantic_match": mode,
    }


def aggregate(per_dialogue: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """ToolTalk's figures over dialogues, as `evaluate_openai.main` totals them: each
    dialogue's metrics (`info["tooltalk_metrics"]`) added into a Counter, then
    `tooltalk.evaluation.metrics.get_metrics` (precision and recall pooled over all calls,
    success rate over dialogues)."""
    total: Counter[str] = Counter()
    for metrics in per_dialogue:
        total += Counter(dict(metrics))
        total["num_conversations"] += 1
    result: dict[str, Any] = metrics_module.get_metrics(total)
    return result
