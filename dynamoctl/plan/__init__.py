"""The plan compiler: a recipe, its hosts and a run directory in, the instances to start
out (docs/architecture.md, "The plan"). The supervisor runs a plan; it does not build one."""
