"""`proposer = "llm"`: API models write SEARCH/REPLACE edits to the editable files.

Each of the K requests of a round picks a model from the (weighted) ensemble, sees the
shared context (context.py) plus its own hypothesis (a pending idea from a person first,
else a distinct direction), and answers with a DESCRIPTION line and edit blocks. Edits
that do not apply are shown to the model once, with the reason, for a repair; a second
failure becomes a rejected candidate with that reason, and the round goes on.

Providers go through their official SDKs: `openai` for any OpenAI-compatible endpoint
(`base_url`: OpenAI, vLLM, Ollama, llama.cpp server, OpenRouter...), `anthropic` for
Claude. The SDK retries quickly (`max_retries`); on top of that, rate limits, 5xx,
timeouts and dropped connections are retried with our own bounded exponential backoff
(`retries`, `backoff`, `backoff_max`), and only then is a `ProposerError` raised: a
candidate is never silently dropped.

    [llm]
    models = [
      { provider = "anthropic", model = "claude-sonnet-4-5", weight = 2,
        price_per_mtok_in = 3.0, price_per_mtok_out = 15.0 },
      { provider = "openai", model = "qwen2.5-coder", base_url = "http://localhost:8000/v1",
        api_key_env = "VLLM_KEY" },
    ]
    timeout = "120s"
    max_cost_usd = 20.0
"""

from __future__ import annotations

import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ratchet.core.candidate import Candidate, Proposal
from ratchet.core.config import CONFIG_FILE, Config, Duration
from ratchet.core.errors import HardStop
from ratchet.core.vocab import CallOutcome
from ratchet.proposers import Estimate, ProposalContext, Proposer, ProposerError, bounded_http
from ratchet.proposers.context import (
    CHARS_PER_TOKEN,
    build_context,
    context_settings,
    editable_files,
    hypotheses,
    hypothesis_text,
    prompt_tokens,
    repair_text,
    validate_section,
    warm_context,
)
from ratchet.proposers.edits import EditParseError, apply_edits, find_description, parse_reply
from ratchet.store.calls import Call, Flight, Meter, gather

DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504, 529}

SYSTEM_PROMPT = """\
You are an expert research engineer improving code in a git repository. An automatic \
judge runs a trusted evaluator on your change, keeps it only if the metric really \
improves, and reverts it otherwise. Propose ONE focused change per answer.

Answer in exactly this format:

DESCRIPTION: <one line saying what this change tries and why it should help>

then one or more edit blocks. An edit block names the file on its own line, then:

path/to/file.py
<<<<<<< SEARCH
exact lines copied from the current file (enough to match exactly one place)
=======
the lines that replace them
>>>>>>> REPLACE

Rules: SEARCH must match the current file character for character, including \
indentation; use several small blocks rather than one huge one; to create a new \
editable file, leave SEARCH empty. A small file (under {whole_lines} lines) may instead \
be rewritten whole with:

path/to/file.py
<<<<<<< FILE
the complete new content
>>>>>>> FILE

Only edit the editable files listed in the task. Write nothing after the last block."""


class ModelSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    provider: Literal["openai", "anthropic"]  # "openai": any OpenAI-compatible server
    model: str = Field(min_length=1)
    base_url: str | None = None  # vLLM, Ollama, llama.cpp server, OpenRouter...
    api_key_env: str | None = None  # the environment variable holding the key
    weight: float = Field(default=1.0, gt=0)  # its share of the ensemble's proposals
    temperature: float | None = Field(default=None, ge=0, le=2)  # None: the model's default
    max_tokens: int = Field(default=4096, ge=1)
    token_param: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"  # openai only
    price_per_mtok_in: float = Field(default=0.0, ge=0)  # USD per million tokens
    price_per_mtok_out: float = Field(default=0.0, ge=0)

    @property
    def label(self) -> str:
        where = f" at {self.base_url}" if self.base_url else ""
        return f"{self.provider}:{self.model}{where}"


class LLMSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    models: list[ModelSpec] = Field(min_length=1)
    timeout: Duration = 120.0  # one request, seconds: per read AND in total
    max_reply_mb: float = Field(default=4.0, gt=0)  # a longer reply fails its proposal
    max_retries: int = Field(default=2, ge=0)  # the SDK's own quick retries
    retries: int = Field(default=5, ge=0)  # ours, with backoff, after the SDK gives up
    backoff: Duration = 2.0
    backoff_max: Duration = 60.0
    concurrency: int | None = Field(default=None, ge=1)  # requests at once (default: K)
    history: int | None = Field(default=None, ge=0)  # default: [context] history
    token_budget: int | None = Field(default=None, ge=500)  # default: [context]'s
    whole_file_max_lines: int = Field(default=400, ge=0)  # shorter files may be rewritten whole
    max_cost_usd: float | None = Field(default=None, gt=0)  # the proposer stops at this spend
    repair: bool = True  # one round trip showing the model its failed edit


@dataclass
class Reply:
    text: str
    input_tokens: int
    output_tokens: int
    error: str | None = None  # a reply that arrived but cannot be used (too large)


class _Unusable(Exception):
    """This request's reply cannot be used; its proposal fails, the round goes on."""


@dataclass
class Attempt:
    """One of the K requests: which model, which hypothesis."""

    index: int
    spec_index: int
    idea: str | None
    angle: str


def load_settings(config: Config) -> LLMSettings:
    if not config.llm:
        raise ProposerError("search.proposer = 'llm' needs an [llm] section with "
                            "models = [{provider = ..., model = ...}]")
    return validate_section(LLMSettings, config.llm, "llm")


class LLMProposer(Proposer):
    name = "llm"
    summary = "API models writing SEARCH/REPLACE edits"
    settings_model = LLMSettings

    @classmethod
    def estimate(cls, config: Config, repo: Path, commit: str, k: int) -> Estimate | None:
        """k requests, each priced at the ensemble's weighted price with a reply of its
        model's max_tokens."""
        if not config.llm:
            return None
        settings = load_settings(config)
        context = context_settings(config, token_budget=settings.token_budget)
        tokens_in = prompt_tokens(repo, commit, config, context.token_budget)
        weights = sum(m.weight for m in settings.models)
        per = sum(m.weight * (tokens_in * m.price_per_mtok_in
                              + m.max_tokens * m.price_per_mtok_out) / 1e6
                  for m in settings.models) / weights
        out_tokens = max(m.max_tokens for m in settings.models)
        return Estimate(k * per, f"{k} requests x ~{tokens_in:,} tokens in, up to "
                        f"{out_tokens:,} out, at the models' prices")

    def __init__(self, config: Config, history: list[Candidate]) -> None:
        self.config = config
        self.settings = load_settings(config)
        self.context = context_settings(config, history=self.settings.history,
                                        token_budget=self.settings.token_budget)
        self.keys = [self._api_key(i, spec) for i, spec in enumerate(self.settings.models)]
        self._clients: dict[int, Any] = {}
        self._lock = threading.Lock()

    # -- set-up -----------------------------------------------------------------------------

    def _api_key(self, i: int, spec: ModelSpec) -> str:
        """Checked before anything runs: a missing key is a config error, not a crash."""
        name = spec.api_key_env or DEFAULT_KEY_ENV[spec.provider]
        value = os.environ.get(name, "")
        if value:
            return value
        if spec.api_key_env is None and spec.base_url:
            return "not-needed"  # local OpenAI-compatible servers usually take any key
        raise ProposerError(
            f"llm.models[{i}].api_key_env: environment variable {name} is not set "
            f"(needed for {spec.label})"
        )

    def _client(self, i: int) -> Any:
        with self._lock:
            if i in self._clients:
                return self._clients[i]
            spec, key = self.settings.models[i], self.keys[i]
            timeout = self.settings.timeout
            kwargs: dict[str, Any] = dict(
                api_key=key, timeout=timeout, max_retries=self.settings.max_retries,
                http_client=bounded_http.client(int(self.settings.max_reply_mb * (1 << 20)),
                                                deadline_s=timeout, timeout=timeout))
            if spec.base_url:
                kwargs["base_url"] = spec.base_url
            if spec.provider == "openai":
                import openai

                client: Any = openai.OpenAI(**kwargs)
            else:
                import anthropic

                client = anthropic.Anthropic(**kwargs)
            self._clients[i] = client
            return client

    # -- the protocol ------------------------------------------------------------------------

    def warm_up(self) -> None:
        """The SDK imports and clients (about 1 s each for openai and anthropic here) and
        the machine's description, made while the study starts rather than in the first
        request's path."""
        for i in range(len(self.settings.models)):
            self._client(i)
        warm_context(self.context)

    def propose(self, k: int, ctx: ProposalContext) -> list[Proposal]:
        with Meter(ctx.state_dir) as meter:  # every request is in the ledger as it ends
            limit = self.settings.max_cost_usd
            # every call's cost (dropped proposals' too), or the history's where the
            # proposer runs without the study's ledger
            spent = max(meter.spent_usd(), sum(_cost_of(c) for c in ctx.history))
            if limit is not None and spent >= limit:
                return []  # llm.max_cost_usd reached: no new proposals
            files = editable_files(ctx.repo, ctx.incumbent, ctx.config)
            shared = build_context(ctx, self.context, files)
            attempts = self.plan(k, ctx)
            workers = min(k, self.settings.concurrency or k)
            pool = ThreadPoolExecutor(max_workers=max(workers, 1))
            try:
                futures = [pool.submit(self._attempt, a, k, ctx, shared, files, meter)
                           for a in attempts]
                proposals = gather(futures, meter)  # re-raises a ProposerError
            finally:  # stopped at once: a request in flight is billed, not waited for
                pool.shutdown(wait=not meter.interrupted, cancel_futures=True)
        return dedupe(proposals)

    def repair(self, proposal: Proposal, diff: str, ctx: ProposalContext) -> Proposal | None:
        """One request: the change as a diff, and the new incumbent's editable files (no
        shared context, no history: the change is already chosen), answered with edit
        blocks against those files. Its call is recorded `repaired`; a reply whose
        edits do not apply, or a request that fails, fails the repair (no second try:
        a new proposal would cost little more)."""
        spec_index = self._model_of(proposal)
        files = editable_files(ctx.repo, ctx.incumbent, ctx.config)
        system = SYSTEM_PROMPT.format(whole_lines=self.settings.whole_file_max_lines)
        messages = [{"role": "user", "content": repair_text(
            ctx, proposal.description, diff, files) + "\n" + REPAIR_INSTRUCTION}]
        calls: list[int] = []
        failed = replace(proposal, files={}, commit=None, calls=calls)
        with Meter(ctx.state_dir) as meter:
            try:
                reply = self.complete(spec_index, system, messages, meter, calls,
                                      ok=CallOutcome.REPAIRED)
            except ProposerError as exc:  # a failed repair drops one proposal, no more
                failed.error = f"the repair failed: {exc}"
                return _with_calls(failed, proposal)
        if reply.error:
            failed.error = f"the repair failed: {reply.error}"
            return _with_calls(failed, proposal)
        messages.append({"role": "assistant", "content": reply.text})
        outcome = self._edits(reply.text, files, ctx)
        if isinstance(outcome, str):
            failed.error = f"the repair did not apply: {_one_line(outcome)}"
            return _with_calls(failed, proposal)
        summary, changed = outcome
        params = dict(proposal.params or {})
        llm = dict(params.get("llm") or {})
        llm["rebased_by_repair"] = ctx.incumbent
        params["llm"] = llm
        return _with_calls(replace(
            proposal, description=summary or proposal.description,
            files={p: c.encode() for p, c in changed.items()}, commit=None, params=params,
            context=(proposal.context or "") + "\n<!-- repair -->\n"
            + _transcript(system, messages), calls=calls), proposal)

    def _model_of(self, proposal: Proposal) -> int:
        """The ensemble's model that made `proposal` (it repairs its own change)."""
        llm = (proposal.params or {}).get("llm") if isinstance(proposal.params, dict) else None
        model = llm.get("model") if isinstance(llm, dict) else None
        found = [i for i, m in enumerate(self.settings.models) if m.model == model]
        return found[0] if found else 0

    def plan(self, k: int, ctx: ProposalContext) -> list[Attempt]:
        """Which model and which hypothesis each request gets (deterministic per round)."""
        rng = random.Random(ctx.config.search.seed * 1_000_003 + ctx.round)
        weights = [m.weight for m in self.settings.models]
        picks = rng.choices(range(len(weights)), weights=weights, k=k)
        attempts = []
        for i, (idea, angle) in enumerate(hypotheses(k, ctx)):
            attempts.append(Attempt(i, picks[i], idea, angle))
        return attempts

    # -- one request (and at most one repair) ------------------------------------------------

    def _attempt(self, attempt: Attempt, k: int, ctx: ProposalContext, shared: str,
                 files: dict[str, str], meter: Meter | None = None) -> Proposal:
        calls: list[int] = []
        proposal = self._attempt_calls(attempt, k, ctx, shared, files, meter, calls)
        proposal.calls = calls  # each request it took, recorded: linked to its candidate
        return proposal

    def _attempt_calls(self, attempt: Attempt, k: int, ctx: ProposalContext, shared: str,
                       files: dict[str, str], meter: Meter | None,
                       calls: list[int]) -> Proposal:
        spec = self.settings.models[attempt.spec_index]
        system = SYSTEM_PROMPT.format(whole_lines=self.settings.whole_file_max_lines)
        messages = [{"role": "user", "content": shared + "\n" + _instruction(attempt, k)}]
        usage = {"input_tokens": 0, "output_tokens": 0, "calls": 0}

        def ask() -> str:
            reply = self.complete(attempt.spec_index, system, messages, meter, calls)
            if reply.error:
                raise _Unusable(reply.error)
            usage["input_tokens"] += reply.input_tokens
            usage["output_tokens"] += reply.output_tokens
            usage["calls"] += 1
            messages.append({"role": "assistant", "content": reply.text})
            return reply.text

        repaired = False
        try:
            text = ask()
        except _Unusable as exc:
            return Proposal(description=_fallback_description(attempt, spec), idea=attempt.idea,
                            params={"llm": {"provider": spec.provider, "model": spec.model,
                                            **usage}},
                            context=_transcript(system, messages[:1]), error=str(exc))
        outcome = self._edits(text, files, ctx)
        if isinstance(outcome, str) and self.settings.repair:
            first_failure = outcome
            messages.append({"role": "user", "content": _repair_message(outcome)})
            try:
                text = ask()
                outcome = self._edits(text, files, ctx)
            except _Unusable as exc:
                outcome = str(exc)
            repaired = True
            if isinstance(outcome, str):
                outcome = (f"edits did not apply, even after one repair: {outcome} "
                           f"(first attempt: {first_failure})")
        cost = (usage["input_tokens"] * spec.price_per_mtok_in
                + usage["output_tokens"] * spec.price_per_mtok_out) / 1e6
        params = {"llm": {
            "provider": spec.provider, "model": spec.model, "temperature": spec.temperature,
            **usage, "cost_usd": round(cost, 6), "repaired": repaired,
            "hypothesis": attempt.idea or attempt.angle,
        }}
        context = _transcript(system, messages)
        if isinstance(outcome, str):
            description = find_description(text) or _fallback_description(attempt, spec)
            return Proposal(description=description, params=params, idea=attempt.idea, context=context,
                            error=_one_line(outcome))
        summary, changed = outcome
        return Proposal(
            description=summary or _fallback_description(attempt, spec),
            files={p: c.encode() for p, c in changed.items()},
            params=params, idea=attempt.idea, context=context,
        )

    def _edits(self, text: str, files: dict[str, str],
               ctx: ProposalContext) -> tuple[str | None, dict[str, str]] | str:
        """(description, changed files), or why the reply cannot be used."""
        if not text.strip():
            return "the reply was empty"
        try:
            parsed = parse_reply(text)
        except EditParseError as exc:
            return f"malformed reply: {exc}"
        protected = [*ctx.config.task.protected, CONFIG_FILE]
        result = apply_edits(parsed.edits, files, ctx.config.task.editable, protected,
                             self.settings.whole_file_max_lines)
        if result.failures:
            return "; ".join(str(f) for f in result.failures)
        if not result.files:
            return "the edits change nothing"
        return parsed.description, result.files

    # -- the API call, with bounded retries ---------------------------------------------------

    def complete(self, spec_index: int, system: str, messages: list[dict],
                 meter: Meter | None = None, calls: list[int] | None = None,
                 ok: CallOutcome = CallOutcome.OK) -> Reply:
        """One reply, with bounded retries. With a `meter`, every HTTP request sent (the
        SDK's retries and ours) is recorded as a call as it ends, its id added to `calls`;
        the one that got a reply as `ok` (CallOutcome.REPAIRED for a repair)."""
        spec = self.settings.models[spec_index]
        delay = self.settings.backoff
        tries = self.settings.retries + 1
        started = time.monotonic()
        last = ""

        prompt_tokens = estimate_tokens(system, messages)
        flight: Flight | None = None

        def note(sent: list[bounded_http.Sent], outcome: CallOutcome, detail: str | None,
                 reply: Reply | None = None) -> None:
            if meter is not None and flight is not None:
                if not meter.land(flight):  # billed as interrupted: the study stopped
                    raise HardStop(f"llm: {spec.label}: the study was stopped at once")
                ids = record_requests(meter, spec, sent, outcome, detail, reply)
                if calls is not None:
                    calls.extend(ids)

        for attempt in range(tries):
            with bounded_http.tap() as sent:
                if meter is not None:  # a hard stop bills this try's requests as they are
                    flight = meter.begin(partial(bill_interrupted, spec, sent, prompt_tokens))
                try:
                    reply = self._call(spec_index, system, messages)
                except Exception as exc:  # classified below; unknown errors are not retried
                    big = bounded_http.too_large(exc)
                    if big is not None:  # the same request would fetch the same reply
                        note(sent, CallOutcome.UNUSABLE, str(big))
                        return Reply("", 0, 0, error=f"{spec.label}: {big}; the reply is not "
                                     "used (llm.max_reply_mb)")
                    retryable, why, wait = _classify(exc)
                    again = retryable and attempt + 1 < tries
                    note(sent, CallOutcome.RETRIED if again else CallOutcome.FAILED, why)
                    if not retryable:
                        raise ProposerError(f"llm: {spec.label}: {why}") from None
                    last = why
                else:
                    note(sent, ok, None, reply)
                    return reply
            if attempt + 1 < tries:
                time.sleep(min(max(delay, wait or 0.0), self.settings.backoff_max))
                delay = min(delay * 2, self.settings.backoff_max)
        raise ProposerError(
            f"llm: {spec.label} still failing after {tries} attempts over "
            f"{time.monotonic() - started:.0f}s (each with {self.settings.max_retries} SDK "
            f"retries): {last}"
        )

    def _call(self, spec_index: int, system: str, messages: list[dict]) -> Reply:
        spec = self.settings.models[spec_index]
        client = self._client(spec_index)
        if spec.provider == "openai":
            options: dict[str, Any] = {spec.token_param: spec.max_tokens}
            if spec.temperature is not None:
                options["temperature"] = spec.temperature
            response = client.chat.completions.create(
                model=spec.model,
                messages=[{"role": "system", "content": system}, *messages],
                **options,
            )
            _check_reply(response, "choices", "a chat completion", spec.base_url)
            text = response.choices[0].message.content or ""
            usage = response.usage
            return Reply(text, getattr(usage, "prompt_tokens", 0) or 0,
                         getattr(usage, "completion_tokens", 0) or 0)
        # the Anthropic SDK (2.x) has no temperature argument; models that still accept
        # one get it in the body
        extra = {} if spec.temperature is None else {
            "extra_body": {"temperature": min(spec.temperature, 1.0)}}
        response = client.messages.create(
            model=spec.model,
            system=system,
            messages=messages,
            max_tokens=spec.max_tokens,
            **extra,
        )
        _check_reply(response, "content", "a message", spec.base_url)
        text = "".join(getattr(block, "text", "") for block in response.content
                       if getattr(block, "type", "") == "text")
        usage = response.usage
        return Reply(text, getattr(usage, "input_tokens", 0) or 0,
                     getattr(usage, "output_tokens", 0) or 0)


# ---------------------------------------------------------------------------------------


class NotAReply(Exception):
    """The endpoint answered 200 with something that is not the protocol's reply (an HTML
    page from a proxy or a wrong base_url, a JSON body without choices): every request
    would get the same, so it is not retried, and no candidate is blamed for it."""


def _check_reply(response: Any, field: str, what: str, base_url: str | None) -> None:
    """Refuse a reply without its `field` (the SDK hands a non-JSON body back as text)."""
    if isinstance(response, str):
        kind = "an HTML page" if "<html" in response[:500].lower() else "text"
        found = f"{kind} ({_one_line(response)[:80]!r})"
    elif not getattr(response, field, None):
        found = f"JSON without {field!r}"
    else:
        return
    where = f"base_url {base_url!r}" if base_url else "the provider's default URL"
    raise NotAReply(f"the endpoint answered {found}, not {what}: check [llm] models' "
                    f"{where} and model")


def _classify(exc: Exception) -> tuple[bool, str, float | None]:
    """(retry?, a one-line reason, the server's retry-after in seconds if it gave one)."""
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    if status is not None:
        message = _one_line(str(getattr(exc, "message", "") or exc))[:300]
        wait = None
        response = getattr(exc, "response", None)
        if response is not None:
            try:
                wait = float(response.headers.get("retry-after", ""))
            except (TypeError, ValueError):
                wait = None
        return status in RETRYABLE_STATUS, f"HTTP {status} ({name}): {message}", wait
    if "Timeout" in name or "Connection" in name:
        return True, f"{name}: {_one_line(str(exc))[:300]}", None
    if _malformed(exc):  # a cut or garbled body: the next try may get a whole one
        return True, f"malformed reply ({name}): {_one_line(str(exc))[:200]}", None
    return False, f"{name}: {_one_line(str(exc))[:300]}", None


def _malformed(exc: BaseException) -> bool:
    """A reply the SDK could not decode (invalid JSON, or a body without the fields a
    reply has), behind however many wrappers."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, (ValueError, KeyError, TypeError, AttributeError, IndexError)) or (
                "Validation" in type(seen).__name__ or "Decode" in type(seen).__name__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def record_requests(meter: Meter, spec: ModelSpec, sent: list[bounded_http.Sent],
                    outcome: CallOutcome, detail: str | None, reply: Reply | None) -> list[int]:
    """Each request of one try, as a call: those the SDK sent again were retried; the
    last ended as the try did, and carries the reply's tokens and their price."""
    ids = []
    now = time.monotonic()
    for i, one in enumerate(sent):
        last = i == len(sent) - 1
        why = f"HTTP {one.status}" if one.status is not None else (one.error or "no response")
        tokens_in = reply.input_tokens if last and reply is not None else 0
        tokens_out = reply.output_tokens if last and reply is not None else 0
        ids.append(meter.record(Call(
            proposer="llm", model=spec.label, outcome=outcome if last else CallOutcome.RETRIED,
            input_tokens=tokens_in, output_tokens=tokens_out,
            cost_usd=(tokens_in * spec.price_per_mtok_in
                      + tokens_out * spec.price_per_mtok_out) / 1e6,
            seconds=(now - one.started) if last else one.seconds,
            detail=(detail or why) if last else why)))
    return ids


def estimate_tokens(system: str, messages: list[dict]) -> int:
    """A prompt's tokens as the context counts them (CHARS_PER_TOKEN), for a request the
    server never answered: its reply would have said."""
    chars = len(system) + sum(len(str(m.get("content", ""))) for m in messages)
    return max(1, -(-chars // CHARS_PER_TOKEN))


def bill_interrupted(spec: ModelSpec, sent: bounded_http.Sends, prompt_tokens: int,
                     seconds: float) -> list[Call]:
    """One try's requests when a hard stop does not wait for them: those the SDK sent
    again are retried, as `record_requests` bills them; the last, still under way (or
    its reply still being read), is interrupted, with the prompt's tokens as sent at the
    model's input price and its time so far. Nothing sent yet: nothing billed, and the
    tap is closed so that nothing is sent after."""
    seen = sent.close()
    out = []
    now = time.monotonic()
    for i, one in enumerate(seen):
        last = i == len(seen) - 1
        if last and (not one.done or one.status == 200):
            out.append(Call(
                proposer="llm", model=spec.label, outcome=CallOutcome.INTERRUPTED,
                input_tokens=prompt_tokens,
                cost_usd=prompt_tokens * spec.price_per_mtok_in / 1e6,
                seconds=now - one.started,
                detail=f"no reply before the stop: {prompt_tokens:,} prompt tokens, "
                       "estimated from the prompt as sent"))
            continue
        why = f"HTTP {one.status}" if one.status is not None else (one.error or "no response")
        out.append(Call(proposer="llm", model=spec.label, outcome=CallOutcome.RETRIED,
                        seconds=one.seconds, detail=why))
    return out


def _cost_of(cand: Candidate) -> float:
    llm = (cand.params or {}).get("llm") if isinstance(cand.params, dict) else None
    return float(llm.get("cost_usd") or 0.0) if isinstance(llm, dict) else 0.0


def _instruction(attempt: Attempt, k: int) -> str:
    return (
        "## Your job now\n\n"
        + hypothesis_text(attempt.idea, attempt.angle, attempt.index, k) + "\n"
        "Propose one change to the editable files that should improve the metric. Start "
        "with the DESCRIPTION line, then the edit blocks.\n"
    )


REPAIR_INSTRUCTION = (
    "## Your job now\n\nRe-apply that change to the files above. Start with the "
    "DESCRIPTION line (what the change does now), then the edit blocks, written against "
    "the files above.\n")


def _with_calls(repaired: Proposal, original: Proposal) -> Proposal:
    """The repair's calls after the original proposal's: all of them bill its fate."""
    repaired.calls = [*original.calls, *repaired.calls]
    return repaired


def _repair_message(failure: str) -> str:
    return (
        "Your edits could not be applied:\n\n"
        f"{failure}\n\n"
        "Reply again with the DESCRIPTION line and the complete, corrected set of edit "
        "blocks, written against the ORIGINAL files shown above (none of your previous "
        "edits were applied). SEARCH must match the file exactly, and only editable files "
        "may change."
    )


def _transcript(system: str, messages: list[dict]) -> str:
    parts = [f"<!-- system -->\n{system}\n"]
    for message in messages:
        parts.append(f"<!-- {message['role']} -->\n{message['content']}\n")
    return "\n".join(parts)


def _fallback_description(attempt: Attempt, spec: ModelSpec) -> str:
    if attempt.idea:
        return f"idea: {attempt.idea}"
    return f"{spec.model}: {attempt.angle}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def dedupe(proposals: list[Proposal]) -> list[Proposal]:
    """A later proposal with exactly the same diff as an earlier one is recorded, not run."""
    seen: dict[tuple, int] = {}
    out = []
    for i, proposal in enumerate(proposals):
        if proposal.error is None and proposal.files:
            key = tuple(sorted(proposal.files.items()))
            if key in seen:
                proposal.error = (f"identical diff to proposal {seen[key] + 1} of this round "
                                  "(duplicate not run)")
                proposal.files = {}
                proposal.duplicate_of = seen[key]
            else:
                seen[key] = i
        out.append(proposal)
    return out
