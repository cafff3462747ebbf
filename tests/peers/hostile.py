"""What a user who may only trigger runs can send: a config file that expands for ever."""


def billion_laughs() -> str:
    """~530 bytes of YAML whose aliases expand to 9**9 strings: the parse is instant, the expansion is not."""
    rows = ['lol: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    return "\n".join([*rows, "corpus: {filters: {boilerplate_phrases: *l8}}", ""])
