from agentrl.tools import Tool, ToolCall, ToolSet, format_tool_call, parse_tool_calls


def test_parses_calls_and_content():
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n' + format_tool_call("mul", {"a": 3})
    p = parse_tool_calls(text)
    assert [(c.name, c.arguments) for c in p.calls] == [("add", {"a": 1, "b": 2}), ("mul", {"a": 3})]
    assert p.errors == [] and p.content == "Let me add."


def test_arguments_as_json_string():
    p = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert p.calls[0].arguments == {"x": 1}


def test_malformed_calls_become_errors_not_exceptions():
    cases = {
        "<tool_call>{not json}</tool_call>": "invalid JSON",
        "<tool_call>[1, 2]</tool_call>": "expected a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "'name'",
        '<tool_call>{"name": "f", "arguments": 3}</tool_call>': "must be an object",
        '<tool_call>{"name": "f", "arguments": {}}': "missing closing",
        # what json.loads raises besides JSONDecodeError: too deep, an integer of over 4,300 digits
        '<tool_call>{"name": "f", "arguments": ' + "[" * 100_000 + "}</tool_call>": "invalid JSON",
        '<tool_call>{"name": "f", "arguments": {"n": ' + "9" * 5000 + "}}</tool_call>": "invalid JSON",
        '<tool_call>{"name": "f", "arguments": "' + "[" * 100_000 + '"}</tool_call>': "not valid JSON",
    }
    for text, needle in cases.items():
        p = parse_tool_calls(text)
        assert p.calls == [], text
        assert len(p.errors) == 1 and needle in p.errors[0], (text, p.errors)


def test_no_calls():
    p = parse_tool_calls("just text")
    assert p.calls == [] and p.errors == [] and p.content == "just text"


def test_toolset_validates_and_never_raises():
    def div(a, b):
        return a / b

    ts = ToolSet([Tool("div", "divide", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}, div)])
    assert ts.call(ToolCall("div", {"a": 6, "b": 3})) == (True, "2.0")
    assert "unknown tool" in ts.call(ToolCall("mul", {}))[1]
    assert "missing required argument 'b'" in ts.call(ToolCall("div", {"a": 1}))[1]
    assert "must be number" in ts.call(ToolCall("div", {"a": "1", "b": 2}))[1]
    assert "must be number" in ts.call(ToolCall("div", {"a": True, "b": 2}))[1]
    assert "unknown argument 'c'" in ts.call(ToolCall("div", {"a": 1, "b": 2, "c": 3}))[1]
    ok, text = ts.call(ToolCall("div", {"a": 1, "b": 0}))
    assert not ok and "division by zero" in text
    assert ts.schemas()[0]["function"]["name"] == "div"
