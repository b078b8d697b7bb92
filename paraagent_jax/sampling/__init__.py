"""paraagent_jax.sampling: the batched KV-cache sampler (prefill + decode).

  sampler         `Sampler` (the host-side driver), `generate`,
                  `continue_generation`, and their states and outputs
  programs        the jitted programs it runs: append a chunk, the decode loop
                  (with the token choice), grow the cache
  cached_forward  the Qwen3 forward over a KV cache (`forward_chunk`) and the
                  CPU decode step's out-major weights (`decode_weights`)
  kv_cache        the cache pytree, its layouts and storage, and the attention
                  that reads it in place (`cache_attention`)

Layer: above `models` (it runs a `qwen3.Qwen3`), beside `learner`; `paraact`
and everything above import it.
"""

from paraagent_jax.sampling.sampler import (
    GenerateOutput,
    Sampler,
    SamplerState,
    SamplerStats,
    continue_generation,
    generate,
)

__all__ = ["GenerateOutput", "Sampler", "SamplerState", "SamplerStats",
           "continue_generation", "generate"]
