"""The APIs' own shapes: each route family's request parsing and response JSON (OpenAI and
llama-server's native routes, Ollama, the utility routes), and the fields bankml refuses."""
