"""Run by the PyTorch env's python (torch + transformers 5.x, no TensorFlow): ModernBERT as its users have it.

    .venv-pt/bin/python tests/peers/pt_modernbert.py logits FOLDER BATCH.npz   # loads FOLDER, writes BATCH.npz.pt.npy
    .venv-pt/bin/python tests/peers/pt_modernbert.py make FOLDER CONFIG_JSON   # a random ModernBertForMaskedLM saved

`logits`: AutoModelForMaskedLM.from_pretrained (output_loading_info) on the batch's input_ids and
attention_mask, in fp32; prints one JSON object (versions, class, loading info, tied decoder). `make`:
ModernBertForMaskedLM(ModernBertConfig(**CONFIG_JSON)) with weights spread wider than the initialiser's
(so a wrong transpose or a wrong norm shows in the logits), saved by save_pretrained.
"""

import json
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForMaskedLM, ModernBertConfig, ModernBertForMaskedLM

command, folder, arg = sys.argv[1:4]
if command == "make":
    torch.manual_seed(0)
    model = ModernBertForMaskedLM(ModernBertConfig(**json.loads(arg))).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    print(json.dumps({"transformers": transformers.__version__}))
else:
    model, info = AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True, dtype=torch.float32)
    batch = np.load(arg)
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(batch["attention_mask"], dtype=torch.long),
        ).logits
    np.save(arg + ".pt.npy", logits.numpy())
    tied = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    print(
        json.dumps(
            {
                "transformers": transformers.__version__,
                "model_class": type(model).__name__,
                "attn_implementation": model.config._attn_implementation,
                "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
                "decoder_tied": tied,
            }
        )
    )
