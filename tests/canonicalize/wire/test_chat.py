def test_a_custom_tool_is_named_by_its_custom_name() -> None:
    """The fork guard judges a ``custom`` call by ``custom.name``: the request side names the tool so."""
    from canonicalize import CHAT

    custom = {"type": "custom", "custom": {"name": "apply_diff", "description": "..."}}
    function = {"type": "function", "function": {"name": "read_file", "parameters": {}}}
    assert [CHAT.tool_name(t) for t in (custom, function, {"type": "custom"})] == ["apply_diff", "read_file", None]
