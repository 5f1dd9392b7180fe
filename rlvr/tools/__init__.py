"""Tools a policy can call inside an episode: formats, the built-in tools, plug-ins, sessions.

`formats` parses a model turn into a call and wraps a tool's answer (tags or hermes);
`python` runs code in the reward sandbox; `search` is BM25 over a local corpus; `registry`
resolves a domain's `tools` list (built-ins and `package.module:function` plug-ins) and checks
it for `rlvr validate`; `session` holds one domain's toolbox and one episode's calls, limits
and counters (what `rlvr.rollout.episode.run_episode` drives).
"""
