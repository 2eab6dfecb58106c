"""Weight quantization: INT8 and INT4 formats, GGUF block formats, `QuantLinear` and `quantize_model`.

    from course_lib.quant import quantize_model
    model = quantize_model(course_lib.load_model(), "int4", group_size=128)

`QuantLinear` is pure PyTorch (dequantize, then multiply). The kernels that multiply the codes directly
(oneDNN on the CPU, Triton on CUDA) are `course_lib.accel`'s, for `LLM(accel=True)`.
"""
from . import gguf_blocks, int4, int8
from .linear import QuantLinear, quantize_model, quantized_copy

__all__ = ["QuantLinear", "quantize_model", "quantized_copy", "int8", "int4", "gguf_blocks"]
