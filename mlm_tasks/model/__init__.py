"""The model: the RoBERTa masked LM (`roberta`), its weights in and out (`init_weights` from a base model,
`pt_export` to PyTorch's layout), the learning-rate schedule (`schedule`) and its FLOPs and MFU (`flops`)."""
