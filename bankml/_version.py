"""bankml's version, below every layer (the JIT cache keys and the OpenAI fingerprint carry it)."""
__version__ = "0.1.0"
