"""Print docs/SERVER.md's per-route field lists from bankml/server/fields.py's tables:

    python scripts/server_fields_doc.py     # paste between "**/v1/chat/completions" and "## What differs"
"""
from bankml.server import fields as F

TABLES = [
    ("/v1/chat/completions (on top of the llama-server fields)",
     {k: v for k, v in F.OPENAI_CHAT.items() if k not in F.LLAMA_SERVER}),
    ("/v1/completions and /completion (on top of the llama-server fields)",
     {k: v for k, v in F.OPENAI_COMPLETIONS.items() if F.LLAMA_SERVER.get(k) is not v}),
    ("llama-server's fields (every /v1/chat/completions, /v1/completions and /completion request)", F.LLAMA_SERVER),
    ("a message of /v1/chat/completions", F.OPENAI_MESSAGE),
    ("/v1/embeddings, /embedding, /embeddings", F.EMBEDDINGS),
    ("/api/chat", F.OLLAMA_CHAT), ("/api/generate", F.OLLAMA_GENERATE), ("a message of /api/chat", F.OLLAMA_MESSAGE),
    ("`options` of /api/chat, /api/generate and /api/embed", F.OLLAMA_OPTIONS), ("/api/embed", F.OLLAMA_EMBED),
]


def section() -> str:
    out = []
    for title, table in TABLES:
        out.append(f"**{title}**\n")
        served = [k for k, r in table.items() if r.what == F.SERVED]
        if served:
            out.append("- served: " + ", ".join(f"`{k}`" for k in served))
        for kind, label in ((F.REFUSED, "refused"), (F.INERT, "no effect")):
            by_note: dict[str, list[str]] = {}
            for k, r in table.items():
                if r.what == kind:
                    by_note.setdefault(r.note, []).append(k)
            if by_note:
                out.append(f"- {label}: " + "; ".join(", ".join(f"`{k}`" for k in ks) + f" ({note})"
                                                      for note, ks in by_note.items()))
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(section())
