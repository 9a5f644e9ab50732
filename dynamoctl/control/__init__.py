"""Reaching a running deployment's supervisor from outside it."""
