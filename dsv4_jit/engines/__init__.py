"""Inside the engines: the vLLM plugin (`vllm_plugin`, with the mHC adapters in `vllm_mhc`), the SGLang route
(`sglang_route`, with the adapters in `sglang_ops`, enabled by the `sglang_models` package) and the SGLang warmup
hook (`sglang_hook`). Importing this package imports no engine."""
