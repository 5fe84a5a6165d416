"""The numpy Llama-family forward pass and its loaders: the reference the Rust engine must match.

``forward`` is the runner's float32 forward before it moved into Rust; ``loaders`` build its
weights from GGUF (dequantised with ``gguf.quants`` or packed) and safetensors files.
"""
