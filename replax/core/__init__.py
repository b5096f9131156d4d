"""The primitives every other package builds on; imports nothing of replax.

- `sharding`: the device mesh, logical-axis rules and NamedShardings.
- `processes`: multi-host start-up, each process's rows of a global array, copies
  between process meshes, agreement across processes.
- `config_utils`: `ConfigError` (one line, exit 2) and the checks that raise it.
- `platforms`: the JAX platforms a process starts, named before JAX starts any.
- `categorical`: exact draws from a categorical distribution (inverse CDF over uniforms).

May import: nothing.
"""
