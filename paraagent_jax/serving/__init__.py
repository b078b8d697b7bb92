"""paraagent_jax.serving: a trained policy behind an OpenAI-compatible endpoint.

  openai_http     a standard-library chat-completions server around a responder
  policy_server   a checkpoint's greedy turns as ``tool_calls`` (the in-process
                  rollout's tokens rebuilt per request)

``python -m paraagent_jax.serve`` is the command line. Layer: may import paraact
(formats, policies, the API policy's conventions) and below; the entry point
imports it.
"""
