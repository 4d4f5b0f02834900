"""Ids as llama-server makes them (tools/server/server-common.cpp): random_string's 32
alphanumerics, behind "chatcmpl-" / "cmpl-" for a completion (gen_chatcmplid) and alone for a
tool call (gen_tool_call_id)."""
from __future__ import annotations

import random
import string

_ALNUM = string.digits + string.ascii_uppercase + string.ascii_lowercase


def random_string(n: int = 32) -> str:
    return "".join(random.choices(_ALNUM, k=n))


def completion_id(prefix: str) -> str:
    """gen_chatcmplid: the prefix ("chatcmpl-", "cmpl-") and random_string()."""
    return prefix + random_string()
