"""The fine_tuning project: an SFT/LoRA fine-tuning job measured for throughput."""
