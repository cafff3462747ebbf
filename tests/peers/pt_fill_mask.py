"""Run by the PyTorch env's python (torch + transformers 5.x, no TensorFlow), as a Hub user would:

    .venv-pt/bin/python tests/peers/pt_fill_mask.py MODEL_FOLDER TOP_K PROBE [PROBE ...]

Loads the folder with AutoModelForMaskedLM (output_loading_info) and runs fill-mask on each probe;
prints one JSON object: versions, loading info, parameter names, whether the decoder is tied, predictions.
"""

import json
import sys

import torch
import transformers
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

folder, top_k, probes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
model, info = AutoModelForMaskedLM.from_pretrained(folder, output_loading_info=True)
tokenizer = AutoTokenizer.from_pretrained(folder)
fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, top_k=top_k)
predictions = [
    {"probe": p, "predictions": [{"token_str": r["token_str"].strip(), "score": float(r["score"])} for r in fill(p)]}
    for p in probes
]
print(
    json.dumps(
        {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "model_class": type(model).__name__,
            "loading_info": {k: sorted(map(str, v)) for k, v in info.items()},
            "parameters": sorted(model.state_dict()),
            "decoder_tied": (
                model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
            ),
            "predictions": predictions,
        }
    )
)
