"""Constrained generation as llama.cpp b11434 does it: GBNF grammars (src/llama-grammar.cpp) and
JSON schemas turned into them (common/json-schema-to-grammar.cpp)."""
