"""Real-but-small stand-ins used by the tests, the benchmarks and `lstar demo`.

Nothing here is a mock: tiny models are real transformers checkpoints saved as
safetensors with real tokenizers, and the fake Hub is a real HTTP server.
"""
