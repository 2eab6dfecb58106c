"""`python -m llama_cpp.server` with llama.cpp's extra buffer types off, for `benchmarks/serve_peers.py`.

On AMX Xeons llama.cpp repacks Q4_1 weights into an AMX layout whose matmul segfaults on multi-token batches
(seen with llama-cpp-python 0.3.36; llama.cpp issue #20824; `benchmarks/compare.py` says the same), and the
server's first prompt is such a batch. llama-cpp-python's server has no option for it, so this sets
`use_extra_bufts = False` in the model parameters and then runs the server with the given arguments.
"""
import llama_cpp.llama_cpp as lib

_default_params = lib.llama_model_default_params


def _params():
    p = _default_params()
    p.use_extra_bufts = False
    return p


lib.llama_model_default_params = _params

if __name__ == "__main__":
    from llama_cpp.server.__main__ import main

    main()
