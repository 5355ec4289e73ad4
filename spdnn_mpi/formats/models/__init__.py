"""Trained MLPs (ONNX, safetensors) read and imported into stores."""
