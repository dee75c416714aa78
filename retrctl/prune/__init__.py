"""Making a retriever smaller: EffiR's coarse step (sub-layer importance, then dropping attention / MLP
sub-layers or whole blocks, ShortGPT), saved as a model stock loaders read.

- ``anatomy``: where the blocks are (Llama-family decoders; BERT-family encoders, which lose whole layers only).
- ``importance``: 1 − cos(input, output) of every attention and MLP sub-layer (and block) on calibration text.
- ``surgery``: the plan (what to drop) and the removal; why single sub-layers are saved as zeros.
- ``save``: prune.json, the chart, the model card, the reload check.
"""
