"""`bankml serve`: the OpenAI and Ollama APIs over bankml, with llama-server's slots and prompt cache."""
