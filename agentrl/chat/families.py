"""Model families: what the renderer must know about a chat template beyond the template itself.

A :class:`ChatFamily` is data, not code: which tool-call parser reads the model's output (``agentrl`` for the tiny
model's ``<tool_call>`` JSON, otherwise a vLLM tool/reasoning parser name), which template kwarg switches thinking or
sets the reasoning effort, where the template takes a past turn's reasoning and a tool call's arguments, and the role
tokens a model stops on. :func:`detect_family` picks one from the chat template's text; ``ChatConfig.family`` names
one explicitly.

Template modes (``ChatConfig.template_mode``), what happens when a template would render history differently from
the tokens the model saw (see :mod:`agentrl.chat.renderer` for the check):

- ``strict``: raise :class:`~agentrl.chat.renderer.TemplateError` (for unknown templates: never guess);
- ``keep``: keep history as the model saw it; new messages are appended as the template renders them after the
  model's own turn (its prefix-preserving variant: e.g. past reasoning is kept). One training sample per episode.
- ``split``: start a new segment whose prompt is the template's own rendering of the conversation; each segment is
  trained with exactly its own context. Costs the re-processed context of every segment in trained tokens.
- ``auto``: ``keep`` for the families below, ``strict`` for templates no family recognises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

TemplateMode = Literal["auto", "strict", "keep", "split"]


@dataclass(frozen=True)
class ChatFamily:
    """What the renderer needs to know about one family's chat template.

    ``tool_parser``: ``"agentrl"`` (:mod:`agentrl.tools`' ``<tool_call>`` JSON), ``"harmony"`` (gpt-oss channels) or a
    vLLM tool parser name. ``reasoning_parser``: a vLLM reasoning parser name or None. ``thinking_kwarg`` /
    ``effort_kwarg``: the template kwargs that ``ChatConfig.thinking`` / ``reasoning_effort`` map to.
    ``reasoning_field``: the assistant-message field the template reads past reasoning from (None: the reasoning stays
    inline in ``content``, as the model wrote it). ``arguments``: whether the template wants a tool call's arguments
    as a ``dict`` or as the JSON ``str``. ``call_ids``: ``"random9"`` for templates that check 9-character ids
    (Mistral). ``stop_role_tokens``: role tokens that end a generation and begin the next message (GLM).
    ``closing_aliases``: end-of-turn tokens the model writes that the template writes differently in history
    (gpt-oss ``<|return|>`` -> ``<|end|>``). ``tool_start``: where the tool-call section starts in raw output.
    ``tool_needs_call``: the template refuses a tool message that answers no call (it is then sent as a user message).
    ``turn_ends``: tokens other than the closing that end an assistant turn by themselves (gpt-oss ``<|call|>``,
    Llama's ``<|eom_id|>``): no closing is added after them.
    ``call_pattern``: a regular expression whose matches in the model's output (reasoning excluded) are the tool
    calls it started; calls started but not read are parse errors (a broken call is counted, never dropped
    silently). ``markers``: substrings of the chat template that identify the family (all must occur);
    ``refuse_tools``: the template has no tool-call format of its own, so a session with tools needs an explicit
    ``ChatConfig.tool_parser`` (the renderer refuses to guess one).
    """

    name: str
    tool_parser: str
    reasoning_parser: str | None = None
    thinking_kwarg: str | None = None
    effort_kwarg: str | None = None
    reasoning_field: str | None = None
    arguments: Literal["dict", "str"] = "dict"
    call_ids: Literal["call", "random9"] = "call"
    stop_role_tokens: tuple[str, ...] = ()
    closing_aliases: dict[str, str] = field(default_factory=dict)
    tool_start: str = "<tool_call>"
    strip_content_before_tools: bool = True
    tool_needs_call: bool = False
    turn_ends: tuple[str, ...] = ()
    call_pattern: str | None = None
    markers: tuple[str, ...] = ()
    refuse_tools: bool = False


_HERMES_CALL = r"<tool_call>"
_DEEPSEEK_CALL = r"<｜tool▁call▁begin｜>"

FAMILIES: dict[str, ChatFamily] = {f.name: f for f in (
    ChatFamily("agentrl", tool_parser="agentrl", markers=("AGENTRL",)),  # the tiny model (matched by identity)
    ChatFamily("qwen3", tool_parser="hermes", reasoning_parser="qwen3", thinking_kwarg="enable_thinking",
               reasoning_field="reasoning_content", call_pattern=_HERMES_CALL,
               markers=("<|im_start|>", "last_query_index", "reasoning_content")),
    ChatFamily("qwq", tool_parser="hermes", reasoning_parser="deepseek_r1", call_pattern=_HERMES_CALL,
               markers=("<|im_start|>", "<|im_start|>assistant\\n<think>\\n")),
    ChatFamily("qwen2.5", tool_parser="hermes", call_pattern=_HERMES_CALL, markers=("<|im_start|>", "<tool_call>")),
    # Llama-3's JSON call is the whole turn (optionally after <|python_tag|>), as vLLM's llama3_json reads it.
    ChatFamily("llama3", tool_parser="llama3_json", tool_start="{", strip_content_before_tools=False,
               turn_ends=("<|eom_id|>",), call_pattern=r'\A\s*(?:<\|python_tag\|>)?\s*\{\s*"name"\s*:',
               markers=("<|start_header_id|>", "<|eot_id|>")),
    ChatFamily("mistral", tool_parser="mistral", call_ids="random9", tool_start="[TOOL_CALLS]", tool_needs_call=True,
               call_pattern=r"\[TOOL_CALLS\]", markers=("[INST]", "[TOOL_CALLS]")),
    # DeepSeek-V3.1 writes NAME<｜tool▁sep｜>ARGS; V3 (and V3-0324) writes function<｜tool▁sep｜>NAME + a ```json block.
    # V3.1's template is told apart by its thinking switch and its name-first call.
    ChatFamily("deepseek_v31", tool_parser="deepseek_v31", reasoning_parser="deepseek_v3", thinking_kwarg="thinking",
               arguments="str", tool_start="<｜tool▁calls▁begin｜>", strip_content_before_tools=False,
               call_pattern=_DEEPSEEK_CALL,
               markers=("<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "thinking",
                        "tool['function']['name'] + '<｜tool▁sep｜>'")),
    ChatFamily("deepseek_v3", tool_parser="deepseek_v3", arguments="str", tool_start="<｜tool▁calls▁begin｜>",
               strip_content_before_tools=False, call_pattern=_DEEPSEEK_CALL,
               markers=("<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "'<｜tool▁sep｜>' + tool['function']['name']")),
    ChatFamily("glm45", tool_parser="glm45", reasoning_parser="glm45", thinking_kwarg="enable_thinking",
               reasoning_field="reasoning_content", stop_role_tokens=("<|user|>", "<|observation|>"),
               call_pattern=_HERMES_CALL, markers=("[gMASK]", "<|observation|>", "<arg_key>")),
    ChatFamily("gpt-oss", tool_parser="harmony", effort_kwarg="reasoning_effort", reasoning_field="thinking",
               closing_aliases={"<|return|>": "<|end|>"}, tool_start="<|start|>assistant to=", tool_needs_call=True,
               turn_ends=("<|call|>",),
               markers=("<|channel|>", "<|message|>", "reasoning_effort")),
    # Gemma-3: vLLM's pythonic tool template (examples/tool_chat_template_gemma3_pythonic.jinja) asks for a python
    # list of calls and renders tool results as user turns; Google's own template has no tool format at all.
    ChatFamily("gemma3_pythonic", tool_parser="pythonic", tool_start="[", strip_content_before_tools=False,
               call_pattern=r"\A\s*\[\s*[A-Za-z_][\w.]*\(",
               markers=("<start_of_turn>", "first_user_prefix", "python list of the function calls")),
    ChatFamily("gemma3", tool_parser="agentrl", refuse_tools=True,
               markers=("<start_of_turn>", "<end_of_turn>", "first_user_prefix")),
)}


def detect_family(chat_template: str | None) -> ChatFamily | None:
    """Returns the family whose markers all occur in ``chat_template`` (first match in :data:`FAMILIES` order), the
    tiny model's own family for its template, or None for a template no family recognises."""
    from agentrl.models.chat_template import CHAT_TEMPLATE

    if not chat_template:
        return None
    if chat_template.strip() == CHAT_TEMPLATE.strip():
        return FAMILIES["agentrl"]
    for fam in FAMILIES.values():
        if fam.name != "agentrl" and all(m in chat_template for m in fam.markers):
            return fam
    return None


@dataclass
class ChatConfig:
    """How episodes are rendered for one model (``rollout.chat`` in configs).

    ``family``: a name from :data:`FAMILIES` or ``"auto"`` (detected from the chat template; unknown templates get
    the ``agentrl`` tool format and ``strict`` mode; Google's Gemma-3 template, which has no tool format, is
    detected as ``gemma3`` and refuses sessions with tools until ``tool_parser`` names one). ``template_mode``: see the module docstring. ``thinking``:
    switches the family's thinking kwarg (``enable_thinking`` for Qwen3/GLM, ``thinking`` for DeepSeek-V3.1; None:
    the template's default). ``reasoning_effort``: gpt-oss's ``low``/``medium``/``high``. ``tool_parser``: override
    the family's (``agentrl``, ``harmony`` or a vLLM tool parser name). ``template_kwargs``: passed to
    ``apply_chat_template`` as they are (the family options above are added to them).
    """

    family: str = "auto"
    template_mode: TemplateMode = "auto"
    thinking: bool | None = None
    reasoning_effort: str | None = None
    tool_parser: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        if self.family != "auto" and self.family not in FAMILIES:
            raise ValueError(f"family must be 'auto' or one of {sorted(FAMILIES)}, got {self.family!r}")
        if self.reasoning_effort is not None and self.reasoning_effort not in ("low", "medium", "high"):
            raise ValueError(f"reasoning_effort must be low, medium or high, got {self.reasoning_effort!r}")

    def resolve(self, chat_template: str | None) -> tuple[ChatFamily, Literal["strict", "keep", "split"], dict[str, Any]]:
        """Returns the family, the effective template mode and the template kwargs for ``chat_template``.

        Raises ``ValueError`` naming the key when an option does not apply to the family (``thinking`` for a family
        without a thinking switch, ``reasoning_effort`` for one without efforts)."""
        self.validate()
        fam = FAMILIES[self.family] if self.family != "auto" else detect_family(chat_template)
        known = fam is not None
        fam = fam or FAMILIES["agentrl"]
        if self.tool_parser:  # the user's choice of format: nothing left to refuse
            fam = ChatFamily(**{**fam.__dict__, "tool_parser": self.tool_parser, "refuse_tools": False,
                                "call_pattern": fam.call_pattern if self.tool_parser == fam.tool_parser else None})
        kwargs = dict(self.template_kwargs)
        if self.thinking is not None:
            if not fam.thinking_kwarg:
                raise ValueError(f"thinking: family {fam.name!r} has no thinking switch in its template")
            kwargs[fam.thinking_kwarg] = self.thinking
        if self.reasoning_effort is not None:
            if not fam.effort_kwarg:
                raise ValueError(f"reasoning_effort: family {fam.name!r} has no reasoning effort in its template")
            kwargs[fam.effort_kwarg] = self.reasoning_effort
        mode = self.template_mode
        if mode == "auto":
            mode = "keep" if known and fam.name != "agentrl" else "strict"
        return fam, mode, kwargs
