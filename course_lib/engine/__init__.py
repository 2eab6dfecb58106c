"""The serving engine: `Sequence` (a request's state), `BlockManager` (KV blocks), `Scheduler`
(who runs this step), `ModelRunner` (tensors in, tokens out), `LLMEngine` (ties them), `LLM` (the offline API)."""
