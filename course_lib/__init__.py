"""course_lib: a small, readable LLM inference engine for the course.

    from course_lib import LLM, SamplingParams
    llm = LLM()                       # SmolLM2-135M-Instruct, offline
    llm.generate(["Hello"], SamplingParams(max_tokens=16))

The data path, one module each: tokenizer -> engine (scheduler, model runner) -> model -> sampling -> tokenizer.
"""
from .config import ModelConfig
from .dtypes import default_device
from .engine.llm import LLM
from .engine.sequence import CompletionOutput, RequestOutput
from .loading import load_model, load_tokenizer
from .sampling import SamplingParams
from .tokenizer import StreamingDetokenizer, Tokenizer

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "ModelConfig", "Tokenizer",
           "StreamingDetokenizer", "default_device", "load_model", "load_tokenizer"]
