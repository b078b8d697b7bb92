"""paraagent_jax.coldstart: multi-agent demonstrations for the cold start.

    roles.scripted_roles(catalog, roles.Imperfection.default())   # gold + mistakes
    chat_roles.chat_roles(api_client.ChatModel(...), cache_dir=...)  # any API model
    kept, stats = orchestrator.Orchestrator(catalog, role_set).run(tasks)
    build.build_demonstrations(config, out_dir)                   # stage=demos

Layer: may import paraact (the protocol and strategies), api_client, fileio
and toolenv; the trainer imports it.
"""
