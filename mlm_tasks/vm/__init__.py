"""What the TPU VM side needs to know about the image it runs on: the supported runtimes
(`runtimes.py`) and, per image TensorFlow, the locked packages installed beside it (`*.txt`,
shipped as package data so any install of this project can stage them)."""
