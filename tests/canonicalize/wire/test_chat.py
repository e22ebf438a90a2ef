def test_a_custom_tool_is_named_by_its_custom_name() -> None:
    """The fork guard judges a ``custom`` call by ``custom.name``: the request side names the tool so."""
    from canonicalize import CHAT

    custom = {"type": "custom", "custom": {"name": "apply_diff", "description": "..."}}
    function = {"type": "function", "function": {"name": "read_file", "parameters": {}}}
    assert [CHAT.tool_name(t) for t in (custom, function, {"type": "custom"})] == ["apply_diff", "read_file", None]


def test_split_is_system_slots_and_history_on_any_messages() -> None:
    """``split`` (roles read at C speed, one leading system message, or the loop) finds
    what ``system_slots`` and ``history`` find, on messages of any shape: roles that
    are not strings (a list, a number, absent), items that are not objects, system
    messages anywhere, with or without content, several or none."""
    import random

    from canonicalize import CHAT

    def message(rng: random.Random) -> object:
        kind = rng.randrange(12)
        if kind == 0:
            return rng.choice(["text", None, 3, ["system"]])  # not an object
        msg: dict[str, object] = {}
        if kind != 1:
            msg["role"] = rng.choice(
                ["system", "developer", "user", "assistant", "tool", ["system"], 7, None, "System"]
            )
        if rng.random() < 0.8:
            msg["content"] = rng.choice(["a", [{"type": "text", "text": "b"}], None])
        return msg

    rng = random.Random(7)
    for _ in range(3000):
        messages = [message(rng) for _ in range(rng.randrange(6))]
        if messages and rng.random() < 0.4:
            messages[0] = {"role": rng.choice(["system", "developer"]), "content": "lead"}
        body = {"messages": messages}
        slots, history = CHAT.split(body)
        assert [(s.path, s.get()) for s in slots] == [(s.path, s.get()) for s in CHAT.system_slots(body)]
        assert len(history) == len(CHAT.history(body))
        assert all(a is b for a, b in zip(history, CHAT.history(body), strict=True))
        assert history is not messages
