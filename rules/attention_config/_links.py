"""Documentation links the attention-configuration rules share."""

HF_ATTENTION = "https://huggingface.co/docs/transformers/main/en/attention_interface"
HF_SDPA = "https://huggingface.co/docs/transformers/main/en/perf_infer_gpu_one#pytorch-scaled-dot-product-attention"
