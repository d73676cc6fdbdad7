"""Alias of `dsv4_jit.engines.sglang_hook`."""
from .sglang_hook import *  # noqa: F401,F403
from .sglang_hook import model_from_server_args, plan_from_server_args, warmup_from_server_args  # noqa: F401
