"""An offline sandbox of real-but-small parts: the fake Hub, webhook and SMTP receivers, tiny models.

`lstar demo` runs the whole loop against these, and the tests use them. Nothing here is a
mock: the fake Hub is a real HTTP server speaking the Hub's API, the receivers are a real
HTTP server and a real SMTP server (aiosmtpd) on 127.0.0.1, and tiny models are real
transformers checkpoints saved as safetensors with real tokenizers.
"""
