"""Federated-learning arithmetic on state dicts (FedAvg) and the model weights it reads and writes: the artifact store (safetensors, SHA-256) and its HTTP transfer. Imports no torch."""
