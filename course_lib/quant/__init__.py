"""Weight quantization: INT8 and INT4 formats, GGUF block formats, `QuantLinear` and `quantize_model`.

    from course_lib.quant import quantize_model
    model = quantize_model(course_lib.load_model(), "int4", group_size=128)

`triton_kernels` is not imported here: importing triton decides, once, whether its kernels run
on a GPU or in the interpreter (TRITON_INTERPRET=1); `QuantLinear` imports it when it first
runs on CUDA.
"""
from . import gguf_blocks, int4, int8
from .linear import QuantLinear, quantize_model, quantized_copy

__all__ = ["QuantLinear", "quantize_model", "quantized_copy", "int8", "int4", "gguf_blocks"]
