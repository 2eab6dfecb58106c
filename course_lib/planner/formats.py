"""Weight formats that engines load, with the bits each layer of a checkpoint in that format takes.

A format is more than its headline number: the scales stored beside the codes cost bits too, and most
formats keep some layers wider than the rest. AWQ, GPTQ and FP8 checkpoints keep the embeddings and
`lm_head` in 16 bits; llama.cpp's Q4_K_M stores `lm_head` in Q6_K and half of the `v_proj` and
`down_proj` layers in Q6_K, the rest in Q4_K. Each number below cites the layout it comes from.

    from course_lib.planner import FORMATS, find_format
    find_format("Q4_K_M").bits_per_weight            # 4.5: a Q4_K block, 144 bytes per 256 weights
    file_bits("Llama-3-8B", "q4_k_m")                 # 4.89: the whole file, lm_head and wider layers included
    plan("llama-3-70b", "h100", weight_format="awq")  # a real 4-bit checkpoint, not the course's QuantLinear
"""
from __future__ import annotations

from dataclasses import dataclass

from ..quant.gguf_blocks import BLOCK_SIZE, TYPE_SIZE
from .names import lookup

_GGML_COMMON = "https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-common.h"
_LLAMA_QUANT = "https://github.com/ggml-org/llama.cpp/blob/master/src/llama-quant.cpp, llama_tensor_get_type"
_QUANTIZE_README = "https://github.com/ggml-org/llama.cpp/blob/master/tools/quantize/README.md"
Q4_0, Q8_0 = (8 * TYPE_SIZE[t] / BLOCK_SIZE for t in ("Q4_0", "Q8_0"))  # 18 and 34 bytes per 32 weights
Q4_K, Q5_K, Q6_K = (8 * size / 256 for size in (144, 176, 210))  # bytes per super-block of 256 weights
GROUP_128 = 4 + (16 + 4) / 128  # 4-bit codes, an fp16 scale and a 4-bit zero point per group of 128


@dataclass(frozen=True)
class WeightFormat:
    """Bits a weight, scales included, for each kind of layer of a checkpoint in one format, and their source."""

    name: str
    bits_per_weight: float  # the decoder layers' linear weights (q, k, v, o, gate, up, down)
    embedding_bits: float  # the input token embeddings
    head_bits: float  # lm_head; a tied embedding table is stored at these bits too (llama.cpp's rule)
    source: str
    needs: str = ""  # what runs it: engines, devices
    mixes: tuple[tuple[str, float, float], ...] = ()  # (linear name, share of its layers, bits): stored wider
    other_bits: float = 16  # norms and biases: 1-D tensors no format quantizes (GGUF writes them in float32)

    def __post_init__(self) -> None:
        for field in ("bits_per_weight", "embedding_bits", "head_bits", "other_bits"):
            if not getattr(self, field) > 0:
                raise ValueError(f"WeightFormat.{field} must be > 0, got {getattr(self, field)!r}")
        if any(not 0 < share <= 1 for _, share, _ in self.mixes):
            raise ValueError(f"WeightFormat.mixes shares must be in (0, 1], got {self.mixes!r}")

    def linear_bits(self, name: str) -> float:
        """Average bits a weight of the linear layer called `name` ("layers.3.mlp.down_proj")."""
        for suffix, share, bits in self.mixes:
            if name.endswith(suffix):
                return share * bits + (1 - share) * self.bits_per_weight
        return self.bits_per_weight


def _gguf(name: str, base: float, base_type: str, head: float, mixes=(), note: str = "") -> WeightFormat:
    head_type = "Q8_0" if head == Q8_0 else "Q6_K"
    return WeightFormat(
        name, base, base, head,
        f"llama.cpp {name.upper()}: {base_type} blocks ({base:.4g} bits a weight, {_GGML_COMMON}); token "
        f"embeddings {base_type}, output (lm_head) {head_type}, norms float32{note} ({_LLAMA_QUANT}); whole "
        f"Llama-3.1-8B files in {_QUANTIZE_README}",
        "llama.cpp, Ollama, LM Studio: CPUs and GPUs of any maker", mixes, other_bits=32)


_K_M_MIX = (("v_proj", 0.5, Q6_K), ("down_proj", 0.5, Q6_K))
_K_M_NOTE = ("; Q6_K for half of the v_proj and down_proj layers (use_more_bits: the first and last eighth, "
             "every third between)")
_70B_NOTE = ("; on 70B models the other v_proj half is Q5_K, counted here as Q4_K (v_proj is 1/8 the size of "
             "q_proj: under 0.1% of the file)")
FORMATS: dict[str, WeightFormat] = {f.name: f for f in [
    _gguf("q4_0", Q4_0, "Q4_0", Q6_K),
    _gguf("q4_k_m", Q4_K, "Q4_K", Q6_K, _K_M_MIX, _K_M_NOTE + _70B_NOTE),
    _gguf("q5_k_m", Q5_K, "Q5_K", Q6_K, _K_M_MIX, _K_M_NOTE),
    _gguf("q6_k", Q6_K, "Q6_K", Q6_K),
    _gguf("q8_0", Q8_0, "Q8_0", Q8_0),
    WeightFormat("awq", GROUP_128, 16, 16,
                 "AutoAWQ GEMM layout (https://github.com/casper-hansen/AutoAWQ, WQLinear_GEMM): int32 qweight "
                 "packing eight 4-bit codes, an fp16 scale and a 4-bit zero (packed qzeros) per group of 128 "
                 "inputs = 4.156 bits; embeddings, lm_head and norms stay fp16",
                 "GPUs (vLLM, SGLang, TGI; vLLM's Marlin kernels from compute capability 8.0): weights 4-bit, "
                 "activations 16-bit"),
    WeightFormat("gptq", GROUP_128, 16, 16,
                 "AutoGPTQ/GPTQModel layout, 4 bits, group 128 (https://github.com/ModelCloud/GPTQModel): the same "
                 "qweight/qzeros/fp16 scales as AWQ plus an int32 g_idx per input (under 0.04 bits a weight, "
                 "left out); embeddings, lm_head and norms stay fp16",
                 "GPUs (vLLM, SGLang; Marlin kernels from compute capability 8.0): weights 4-bit, activations 16-bit"),
    WeightFormat("mlx-4bit", 4 + 32 / 64, 4 + 32 / 64, 4 + 32 / 64,
                 "mlx-lm's default quantization (https://github.com/ml-explore/mlx-lm, mlx.nn.quantize): affine "
                 "4-bit in groups of 64 with a 16-bit scale and bias each = 4.5 bits; embeddings and lm_head "
                 "quantized alike, norms 16-bit",
                 "Apple silicon only (MLX)"),
    WeightFormat("fp8", 8, 16, 16,
                 "FP8 E4M3 checkpoints (llm-compressor / vLLM, https://docs.vllm.ai/en/latest/features/"
                 "quantization/fp8.html): 8 bits a weight plus one float32 scale per tensor or per output "
                 "channel (negligible); lm_head and embeddings stay 16-bit",
                 "FP8 matmuls need compute capability >= 8.9 (Ada, Hopper, Blackwell); older GPUs run it "
                 "weight-only (vLLM's FP8 Marlin), activations 16-bit"),
    WeightFormat("bf16", 16, 16, 16, "bfloat16: 2 bytes a parameter, as Hugging Face checkpoints ship",
                 "any GPU with bfloat16 (compute capability >= 8.0), CPUs"),
    WeightFormat("fp16", 16, 16, 16, "float16: 2 bytes a parameter", "any GPU, CPUs"),
]}
ALIASES = {"float16": "fp16", "bfloat16": "bf16", "half": "fp16"}

# Whole Llama-3.1-8B GGUF files as llama.cpp publishes them (_QUANTIZE_README's table): (size in GiB, bits a
# weight over the whole file). A format's block bits (`bits_per_weight`: Q4_K is 4.5) are not a file's: Q4_K_M
# stores lm_head and some layers wider, so its file averages 4.89. `file_bits(config, name)` computes the latter.
LLAMA_31_8B_FILES = {"q4_k_m": (4.58, 4.8944), "q5_k_m": (5.33, 5.7036), "q6_k": (6.14, 6.5633),
                     "q8_0": (7.95, 8.5008)}
LLAMA_31_8B_FILES_SOURCE = _QUANTIZE_README


def find_format(name: str | WeightFormat) -> WeightFormat:
    """A format from `FORMATS` by forgiving name ("Q4_K_M", "q4-k-m", "AWQ", "float16"); a ValueError lists them."""
    if isinstance(name, WeightFormat):
        return name
    name = ALIASES.get(name.lower(), name)
    return FORMATS[lookup(name, FORMATS, "weight format")]
