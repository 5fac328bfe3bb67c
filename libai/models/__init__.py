"""libai models. (The Transformer models arrive with later issues; `mlp_classifier` is a small
model for the trainer's tests and examples.)"""
