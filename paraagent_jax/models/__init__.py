"""paraagent_jax.models: the policy network.

  qwen3      Qwen3 in Flax NNX (logical axis names on every parameter): the
             cache-free forward; the KV-cache forward is `paraagent_jax.sampling`'s
  attention  the training forward's attention implementations
  hf_io      safetensors <-> parameters, both ways, by one declarative table
  memory     parameter and AdamW bytes per device on a mesh, without allocating

Layer: may import sharding, tokenizer and checksums; sampling, learner,
rundir and everything above import it.
"""
