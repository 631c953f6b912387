"""LLM engines: the OpenAI-compatible client and the local llama.cpp server."""
