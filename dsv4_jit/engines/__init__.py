"""Inside the engines: the vLLM plugin (`vllm_plugin`, with the mHC adapters in `vllm_mhc`) and the SGLang
warmup hook (`sglang_hook`). Importing this package imports neither engine."""
