"""The supervisor: a recipe becomes a plan, the plan becomes supervised processes."""
