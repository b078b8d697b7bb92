"""paraagent_jax.data: SFT data sources and batching.

``config.data.source`` names a module here whose ``make_sft_data(...)``
returns a resumable iterator (``state()`` / ``restore()``):
``demonstrations`` (the cold start's TFDS dataset, length-bucketed
batches) and ``synthetic``; ``tfds_builders`` holds the TFDS builders,
``demo_tokenizer`` the demo BPE, ``copy_stats`` the copy-token statistics,
``packing`` several demonstrations per row (``data.pack``).

Layer: may import paraact (the protocol), tokenizer and the utilities, and
toolenv; the trainer imports it.
"""
