"""bankml: a graph compiler for LLM inference, bit-identical to llama.cpp."""
